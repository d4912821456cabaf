"""Explanations of a build-out result: which limits bind, their slack, what the next unit needs.

Binding is decided by *what-if solves*, never by MILP row duals (which are not shadow
prices of an integer program): a limit binds the primary objective when relaxing it alone
makes the optimum strictly better. For the power budget the what-if is "the least power of
any strictly better plan" (so the message says how many kW more would help). The rack and
fabric entries describe the per-rack and per-switch limits that fix the secondary counts.
Server types (and switch chips) that fit no rack come first, one entry per reason
(:func:`unfit_bindings`), for every objective: a plan without them must say why.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from math import ceil

from constraints.buildout import fabric as buildout_fabric
from constraints.buildout import install_unit as buildout_install_unit
from constraints.buildout import max_count as buildout_max_count
from constraints.buildout import rack_feed as buildout_rack_feed
from constraints.buildout import rack_power as buildout_rack_power
from constraints.buildout import rack_units as buildout_rack_units
from constraints.buildout import racks as buildout_racks
from constraints.buildout import power as buildout_power
from constraints.buildout import second_tier as buildout_second_tier
from constraints.buildout import target as buildout_target
from optimizer.budget import Budget
from optimizer.buildout.evaluate import Evaluation, rack_limit_kw
from optimizer.buildout.model import build, family_module
from optimizer.buildout.plan import BuildoutPlan
from optimizer.buildout.schema import Problem
from optimizer.buildout.solve import MIN_SOLVE_S, BuildoutSolution, solve, solve_stage
from optimizer.result import Binding, Conflict, ConstraintKey, Status

WHATIF_TIME_S = 10.0  # the longest one what-if solve may take
MIN_WHATIF_S = 0.02   # with less time left a what-if solve is skipped (and counted)


@dataclass(frozen=True)
class BuildoutExplanation:
    """Why the plan is what it is (or why there is none).

    Attributes:
        binding: the binding limits at the plan, each with its slack.
        conflict: the conflicting constraints of an infeasible instance, one line each.
        achievable: for an infeasible ``target_gpus``: the most GPUs any plan fits (or the
            budget the fixed load misses), see :func:`most_gpus_without_target`.
        cut_short: parts the time limit cut short.
        wall_s: wall time of the explanation (its what-if solves included), s.
    """

    binding: tuple[Binding, ...] = ()
    conflict: Conflict | None = None
    achievable: dict | None = None
    cut_short: tuple[str, ...] = ()
    wall_s: float = 0.0


class WhatIfs:
    """The time of the explanation's what-if solves: each gets at most ``WHATIF_TIME_S``, none
    runs past the budget's deadline, and those skipped for lack of time are counted."""

    def __init__(self, budget: Budget):
        self.budget = budget
        self.skipped = 0

    def time_s(self) -> float | None:
        """Seconds the next what-if solve may take; None: skip it (the deadline has passed)."""
        if not self.budget.limited:
            return WHATIF_TIME_S
        left = self.budget.remaining_s()
        if left <= MIN_WHATIF_S:
            self.skipped += 1
            return None
        return min(WHATIF_TIME_S, left)


def kw(x: float) -> str:
    """Format kW for messages: 10.2, 0.6, 122.4 (no float noise)."""
    return f"{round(x, 3):g}"


def num(x: float | int | None) -> str:
    """Readable number: 88, 2,400,000, 112.2."""
    if x is None:
        return "-"
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.2f}"


def _primary(p: Problem, whatifs: WhatIfs, omit: frozenset[str] = frozenset()) -> float | None:
    """The optimum of ``p.objective`` alone (no secondary stages), None when not proven or skipped."""
    limit = whatifs.time_s()
    if limit is None:
        return None
    model = build(p, omit=omit)
    obj = p.objective
    out = solve_stage(model, obj.expr(model), obj.sense, limit)
    if out.status != Status.OPTIMAL:
        return None
    return obj.to_unit(out.objective, model)


def least_power_kw(p: Problem, whatifs: WhatIfs, value: float | None = None,
                   min_gpus: int | None = None) -> float | None:
    """Least total power (kW) of any plan without the power budget that is strictly better than
    ``value`` in ``p.objective`` (or, with ``value`` None, that holds ``min_gpus`` GPUs). None
    when no such plan exists or the what-if solve is skipped."""
    limit = whatifs.time_s()
    if limit is None:
        return None
    need = min_gpus or 0
    if value is not None:
        need = max(need, p.objective.min_gpus_better_than(value))
    model = build(p, omit=frozenset({"power"}), min_gpus=need)
    if need:
        model.cp.add(model.gpus >= need)
    if value is not None:
        model.cp.add(p.objective.better_than(model, value))
    out = solve_stage(model, model.power_w, "min", limit)
    if out.status != Status.OPTIMAL:
        return None
    return out.objective / 1000.0


def _chips_kw_for(p: Problem, servers: dict[str, int], whatifs: WhatIfs) -> float | None:
    """Least switch-chip power (kW) of a fabric for exactly ``servers`` (a what-if solve without
    the budget); None when no fabric and racks can hold them (or the time limit skips it)."""
    limit = whatifs.time_s()
    if limit is None:
        return None
    model = build(p, omit=frozenset({"power", "target", "max_count"}),
                  min_gpus=sum(p.type(n).gpus * c for n, c in servers.items()))
    for t in p.types:
        model.cp.add(model.n[t.name] == servers.get(t.name, 0))
    out = solve_stage(model, model.leaves + model.s, "min", limit)
    if out.status != Status.OPTIMAL:
        return None
    return out.objective * p.fabric.switch_power_kw


def next_unit(p: Problem, servers: dict[str, int], ev: Evaluation, whatifs: WhatIfs
              ) -> tuple[str, float, float, float, float] | None:
    """The cheapest (in kW) next install unit: (phrase, server kW, second-tier kW, switch-chip kW, total kW).

    Server types that fit no rack (:func:`unfit_bindings`) or are at their ``max_count`` are
    skipped. With ``fabric.switch_power_kw`` the extra switch chips come from a what-if solve
    (least chips for the plan's servers plus the unit, against the plan's chips).
    """
    u = p.install_unit_servers
    best = None
    f = p.fabric
    chips_now = ev.leaves + ev.spine
    for t in p.types:
        if t.max_count is not None and servers.get(t.name, 0) + u > t.max_count:
            continue
        if buildout_racks.unfit_families(p, t.power_w, t.rack_units):
            continue
        srv = u * t.power_kw
        tier = 0.0
        if f is not None and not ev.second_tier and ev.gpus + u * t.gpus > f.one_tier_max_gpus:
            tier = f.second_tier_power_kw
        chips = 0.0
        if f is not None and f.switch_power_kw > 0:
            more = dict(servers)
            more[t.name] = more.get(t.name, 0) + u
            need = _chips_kw_for(p, more, whatifs)
            if need is None:
                continue
            chips = max(0.0, need - chips_now * f.switch_power_kw)
        dom = 0.0  # a new scale-up domain's fabric when the domains built are full
        if p.domains is not None and ev.gpus + u * t.gpus > ev.domains * p.domains.cards:
            dom = p.domains.power_kw * (-(-(ev.gpus + u * t.gpus) // p.domains.cards) - ev.domains)
        cand = (srv + tier + chips + dom, -t.gpus, t.name, srv, tier, chips, dom)
        if best is None or cand < best:
            best = cand
    if best is None:
        return None
    total, _g, name, srv, tier, chips, dom = best
    phrase = f"one more {name} server" if u == 1 else f"one more install unit ({u} x {name})"
    return phrase, srv, tier, chips, total, dom


def _need_phrase(nu: tuple, left_kw: float) -> str:
    phrase, srv, tier, chips, total, dom = nu
    extra = [f"{kw(tier)} kW second tier"] if tier else []
    extra += [f"{kw(chips)} kW switch chips"] if chips else []
    extra += [f"{kw(dom)} kW for a new scale-up domain's fabric"] if dom else []
    parts = f"{kw(total)} kW" if not extra else f"{kw(total)} kW ({kw(srv)} kW servers + {' + '.join(extra)})"
    return f"{phrase} needs {parts}, {kw(left_kw)} kW left"


def unfit_bindings(p: Problem) -> list[Binding]:
    """Server types (and switch chips) that fit no rack, by power (cooling or feeds) or by
    rack units: one entry per reason, slack = the limit minus the item's figure (negative)."""
    out = []
    items = [(t.name, f"one {t.name} server", t.power_kw, t.power_w, t.rack_units) for t in p.types]
    f = p.fabric
    if f is not None and f.switches_in_racks:
        items.append((buildout_racks.SWITCHES.element, "one switch chip", f.switch_power_kw, f.switch_power_w,
                      f.switch_rack_units))
    for name, what, pkw, pw, units in items:
        for fam in buildout_racks.unfit_families(p, pw, units):
            key = ConstraintKey(fam, name)
            if fam == buildout_rack_power.FAMILY:
                best = max(p.cooling_only_w().values()) / 1000
                msg = (f"{what} draws {kw(pkw)} kW, more than any rack can cool "
                       f"({buildout_rack_power.limits_text(p)}): it fits no rack and none is planned")
                out.append(Binding(key, round(best - pkw, 6), "kW", msg))
            elif fam == buildout_rack_feed.FAMILY:
                msg = (f"{what} draws {kw(pkw)} kW, more than a rack's feeds allow "
                       f"({buildout_rack_feed.feed_text(p)}): it fits no rack and none is planned")
                out.append(Binding(key, round(p.feed_usable_kw - pkw, 6), "kW", msg))
            else:
                msg = (f"{what} is {units}U, taller than a {p.rack_units}U rack: it fits no rack "
                       f"and none is planned")
                out.append(Binding(key, p.rack_units - units, "U", msg))
    return out


def bindings(p: Problem, value: float, plan: BuildoutPlan, ev: Evaluation, whatifs: WhatIfs) -> list[Binding]:
    """Binding limits at the reported plan (see the module docstring); ``value`` is the plan's
    ``p.objective`` value."""
    obj = p.objective
    out: list[Binding] = unfit_bindings(p)
    servers = plan.servers
    left = p.power_budget_kw - ev.power_kw
    nu = next_unit(p, servers, ev, whatifs)
    unit_name = obj.short_unit
    unit = obj.unit_for(p)
    # power budget
    need = least_power_kw(p, whatifs, value)
    if need is not None:
        msg = (f"{kw(ev.power_kw)} of {kw(p.power_budget_kw)} kW used" +
               (f"; {_need_phrase(nu, left)}" if nu and obj.next_unit_hint else "") +
               f"; a better plan ({unit_name}) needs at least {kw(need)} kW, {kw(need - p.power_budget_kw)} kW more budget")
        out.append(Binding(buildout_power.KEY, round(left, 6), "kW", msg))
    # second tier
    f = p.fabric
    if f is not None and f.second_tier_power_kw > 0:
        p0 = dataclasses.replace(p, fabric=dataclasses.replace(f, second_tier_power_kw=0.0))
        alt = _primary(p0, whatifs)
        if obj.better(alt, value):
            slack = 0 if ev.second_tier else f.one_tier_max_gpus - ev.gpus
            state = ("the plan has a second tier" if ev.second_tier
                     else f"the plan stays within one tier ({ev.gpus} of {f.one_tier_max_gpus} GPUs)")
            out.append(Binding(buildout_second_tier.ACTIVATION, slack, "GPUs",
                               f"more than {f.one_tier_max_gpus} GPUs need {kw(f.second_tier_power_kw)} kW of "
                               f"second-tier switching; {state}; without that power the optimum would be "
                               f"{num(alt)} {unit}"))
    # install unit
    u = p.install_unit_servers
    if u > 1:
        alt = _primary(dataclasses.replace(p, install_unit_servers=1), whatifs)
        if obj.better(alt, value):
            msg = f"servers come in whole units of {u}"
            if nu:
                msg += f": {_need_phrase(nu, left)}"
            msg += f"; with single servers the optimum would be {num(alt)} {unit}"
            out.append(Binding(ConstraintKey(buildout_install_unit.FAMILY, "all types"), round(left, 6), "kW", msg))
    # max_count
    for t in p.types:
        if t.max_count is not None and servers.get(t.name, 0) >= t.max_count:
            types = tuple(dataclasses.replace(x, max_count=None) if x.name == t.name else x for x in p.types)
            alt = _primary(dataclasses.replace(p, types=types), whatifs)
            if obj.better(alt, value):
                out.append(Binding(ConstraintKey(buildout_max_count.FAMILY, t.name), 0, "servers",
                                   f"all {t.max_count} allowed {t.name} servers are used; without the cap the "
                                   f"optimum would be {num(alt)} {unit}"))
    # target
    if p.target_gpus is not None and obj.needs_target:
        out.append(Binding(buildout_target.KEY, ev.gpus - p.target_gpus, "GPUs",
                           f"the plan must hold at least {p.target_gpus} GPUs; it holds {ev.gpus}"))
    out.extend(rack_bindings(p, plan))
    out.extend(fabric_bindings(p, plan, ev))
    return out


def rack_content(p: Problem, pat) -> tuple[dict[str, int], int, float, int]:
    """(servers per type, switch chips, kW, U) of one rack pattern, in input units."""
    content = {t.name: c for t, c in zip(p.types, pat.counts) if c}
    sw = pat.counts[len(p.types)] if len(pat.counts) > len(p.types) else 0
    f = p.fabric
    rk = sum(p.type(n).power_kw * c for n, c in content.items()) + (sw * f.switch_power_kw if sw else 0.0)
    ru = sum(p.type(n).rack_units * c for n, c in content.items()) + (sw * f.switch_rack_units if sw else 0)
    return content, sw, rk, ru


def rack_text(content: dict[str, int], sw: int) -> str:
    parts = [f"{c} x {n}" for n, c in content.items()]
    if sw:
        parts.append(f"{sw} switch chip{'s' if sw != 1 else ''}")
    return " + ".join(parts) or "nothing"


def rack_bindings(p: Problem, plan: BuildoutPlan) -> list[Binding]:
    """Per-rack limits (cooling power, feed power, rack units) that stop a full rack taking one
    more server. A rack's power limit is the lower of its cooling limit (``rack_power``) and
    the usable feed power (``rack_feed``); the entry is named after the one that is lower."""
    present = [p.type(n) for n, c in plan.servers.items() if c > 0]
    found: dict[tuple[str, str], dict] = {}
    for group in plan.racks:
        pat, mult = group.pattern, group.count
        content, sw, rk, ru = rack_content(p, pat)
        lim = rack_limit_kw(p, pat.cooling)
        blocks = {}
        for t in present:
            over_kw = rk + t.power_kw > lim + 1e-9
            over_u = ru + t.rack_units > p.rack_units
            if not (over_kw or over_u):
                blocks = None
                break
            if over_kw:
                blocks.setdefault("power", (t, rk + t.power_kw))
            if over_u:
                blocks.setdefault(buildout_rack_units.FAMILY, (t, ru + t.rack_units))
        if not blocks:
            continue
        what = rack_text(content, sw)
        for fam, (t, after) in blocks.items():
            if fam == "power":
                cool = {"air": p.air_cooled_kw, "liquid": p.liquid_cooled_kw}[pat.cooling]
                fam = buildout_rack_feed.FAMILY if lim < cool - 1e-9 else buildout_rack_power.FAMILY
            slack = round(lim - rk, 6) if fam != buildout_rack_units.FAMILY else p.rack_units - ru
            cur = found.get((fam, pat.cooling))
            if cur is None or slack < cur["slack"]:
                found[(fam, pat.cooling)] = {"slack": slack, "racks": mult + (cur["racks"] if cur else 0),
                                             "what": what, "rk": rk, "ru": ru, "t": t, "after": after, "lim": lim}
            else:
                cur["racks"] += mult
    out = []
    for (fam, cooling), d in sorted(found.items()):
        if fam == buildout_rack_power.FAMILY:
            msg = (f"{cooling}-cooled racks ({kw(d['lim'])} kW each): fullest holds {d['what']} = {kw(d['rk'])} kW; "
                   f"one more {d['t'].name} would draw {kw(d['after'])} kW")
            out.append(Binding(ConstraintKey(fam, cooling), d["slack"], "kW", msg))
        elif fam == buildout_rack_feed.FAMILY:
            msg = (f"{cooling}-cooled racks, feeds {buildout_rack_feed.feed_text(p)}: fullest holds {d['what']} = "
                   f"{kw(d['rk'])} kW; one more {d['t'].name} would draw {kw(d['after'])} kW")
            out.append(Binding(ConstraintKey(fam, cooling), d["slack"], "kW", msg))
        else:
            msg = (f"{cooling}-cooled racks ({p.rack_units}U): fullest holds {d['what']} = {d['ru']}U; "
                   f"one more {d['t'].name} would need {d['after']}U")
            out.append(Binding(ConstraintKey(fam, cooling), d["slack"], "U", msg))
    return out


def fabric_bindings(p: Problem, plan: BuildoutPlan, ev: Evaluation) -> list[Binding]:
    """Leaf and spine port use; what one more server's links would need."""
    f = p.fabric
    if f is None:
        return []
    out = []
    r = f.switch_radix
    leaves = [(g.downlinks, g.uplinks, g.count) for g in plan.leaves]
    down_cap = sum(d * c for d, _u, c in leaves)
    free = down_cap - ev.gpu_links
    placeable = [t for t in p.types if not buildout_racks.unfit_families(p, t.power_w, t.rack_units)]
    if not placeable:
        return []  # no server fits a rack (unfit_bindings says why): no fabric to describe
    g = max((t.gpus for t in placeable if plan.servers.get(t.name, 0) > 0), default=max(t.gpus for t in placeable))
    more = g * p.install_unit_servers * f.gpu_links
    if ev.second_tier:
        d_max = max(d for d, _u, _c in leaves) if leaves else 0
        per = f"{d_max} downlinks per leaf" if d_max else "no leaves"
    else:
        d_max = r
        per = f"one tier, {r} downlinks per leaf"
    extra = max(0, ceil((more - free) / d_max)) if d_max else 0
    what = "one more server" if p.install_unit_servers == 1 else "one more install unit"
    if not ev.second_tier and ev.gpus + g * p.install_unit_servers > f.one_tier_max_gpus:
        need = (f"takes the GPUs past {f.one_tier_max_gpus}: it needs a two-tier leaf/spine fabric "
                f"(leaf ports split into downlinks and uplinks, oversubscription <= {float(f.max_oversubscription):g})")
    else:
        need = f"needs {extra} more leaf chip{'s' if extra != 1 else ''}"
    out.append(Binding(buildout_fabric.LEAF_DOWN, free, "ports",
                       f"{ev.leaves} leaf chips ({per}): {ev.gpu_links} GPU links on {down_cap} downlink ports; "
                       f"{what} ({more} links) {need}"))
    if ev.second_tier:
        spine_free = ev.spine * r - ev.uplinks
        out.append(Binding(buildout_fabric.SPINE, spine_free, "ports",
                           f"{ev.spine} spine chips: {ev.uplinks} leaf uplinks on {ev.spine * r} spine ports"))
    return out


def conflict_details(p: Problem, keys: tuple[ConstraintKey, ...], whatifs: WhatIfs) -> list[str]:
    """One line per conflicting key, plus the power a target would need when power is in the conflict."""
    lines = []
    for k in keys:
        try:
            lines.append(f"{k}: {family_module(k.family).describe(k, p)}")
        except KeyError:
            lines.append(str(k))
    fams = {k.family for k in keys}
    if "power" in fams and p.target_gpus is not None:
        need = least_power_kw(p, whatifs, min_gpus=p.target_gpus)
        if need is not None:
            lines.append(f"the least power of any plan with {p.target_gpus} GPUs is {kw(need)} kW "
                         f"> {kw(p.power_budget_kw)} kW budget")
    return lines


def most_gpus_without_target(p: Problem, budget: Budget) -> dict | None:
    """For an infeasible ``target_gpus``: the most GPUs any plan fits within the other limits
    (the ``gpus`` objective without the target, solved within ``budget``), or None when there is
    no target or no plan; a fixed load that takes the whole budget: the budget missing before
    the first server."""
    from objectives.buildout import registry

    if p.fixed_w >= p.budget_w:  # no server at all: the budget is the answer
        short = (p.fixed_w - p.budget_w) / 1e3
        return {"requirement": "power_budget_kw", "best": 0, "required": p.power_budget_kw,
                "detail": f"the fixed load ({p.fixed_power_kw:g} kW) takes the whole {p.power_budget_kw:g} kW budget: "
                          f"no server fits; {short:g} kW more budget covers the fixed load, the first server "
                          f"needs its own power on top"}
    if p.target_gpus is None:
        return None
    best = solve(dataclasses.replace(p, target_gpus=None, objective=registry()["gpus"]), budget)
    if best.plan is None or best.value is None:
        return {"requirement": "target_gpus", "best": 0, "required": p.target_gpus,
                "detail": f"no plan holds any GPU within these limits; {p.target_gpus} required"}
    proven = "" if best.status == Status.OPTIMAL else " (not proven: time limit)"
    return {"requirement": "target_gpus", "best": int(best.value), "required": p.target_gpus,
            "detail": f"at most {int(best.value)} GPUs fit these limits{proven}; {p.target_gpus} required"}


def explain(p: Problem, solution: BuildoutSolution, budget: Budget) -> BuildoutExplanation:
    """The explanation of a solution; its what-if solves end by ``budget``'s deadline (those
    skipped are listed under ``cut_short``).

    A plan: its binding limits (:func:`bindings`). Infeasible: the conflicting constraints, one
    line each (:func:`conflict_details`), and what is achievable (:func:`most_gpus_without_target`).
    No plan within the time limit: nothing to explain.
    """
    t0 = time.perf_counter()
    whatifs = WhatIfs(budget)
    if solution.plan is None:
        if solution.status != Status.INFEASIBLE:
            return BuildoutExplanation(wall_s=time.perf_counter() - t0)
        keys = list(solution.conflict)
        conflict = Conflict(keys, conflict_details(p, solution.conflict, whatifs) or ["the limits cannot all hold"])
        achievable = most_gpus_without_target(p, budget.split(1.0, at_least_s=MIN_SOLVE_S))
        return BuildoutExplanation(conflict=conflict, achievable=achievable, wall_s=time.perf_counter() - t0)
    binding = bindings(p, solution.value, solution.plan, solution.evaluation, whatifs)
    cut = ()
    if whatifs.skipped:
        cut = (f"explanation: {whatifs.skipped} what-if solves skipped (their lines are left out)",)
        budget.note_cut("build-out explanation")
    return BuildoutExplanation(binding=tuple(binding), cut_short=cut, wall_s=time.perf_counter() - t0)
