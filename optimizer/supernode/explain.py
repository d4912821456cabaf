"""Explanations of a supernode plan: what binds each instance, why the alternatives lost,
flip thresholds of tier parameters, and the conflicting constraints of an infeasible instance.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from constraints.supernode import cards as sn_cards
from constraints.supernode import pool as sn_pool
from constraints.supernode import target as sn_target
from optimizer.budget import Budget
from optimizer.result import Binding, Conflict, ConstraintKey, Status
from optimizer.supernode.model import family_module
from optimizer.supernode.perf import SCALE_UP, OptionResult, a2a_time, evaluate_option
from optimizer.supernode.schema import GB, Problem
from optimizer.supernode.solve import SupernodeSolution, solve

THRESHOLD_TIME_S = 8.0  # the flip thresholds' re-solves together take at most this long
MIN_THRESHOLD_S = 0.5   # ... and at least this long, even when the budget is spent

LIMIT_NAMES = {"memory": "HBM capacity", "host_capacity": "host memory capacity",
               "pool_capacity": "memory pool capacity", "slo": "step time (per-token target)", "": "nothing"}


@dataclass(frozen=True)
class SupernodeExplanation:
    """Why the plan is what it is (or why there is none).

    Attributes:
        binding: limits that bind (or nearly bind) at the plan, each with its slack.
        alternatives: the best option of every size and fabric and the other placements at the
            chosen size, each with why it lost (:func:`alternatives`).
        thresholds: flip thresholds of tier parameters (:func:`flip_thresholds`).
        conflict: the conflicting constraints of an infeasible instance, one line per family.
        achievable: infeasible: the best any option reaches on what failed (:func:`achievable`).
    """

    binding: tuple[Binding, ...] = ()
    alternatives: tuple[dict, ...] = ()
    thresholds: tuple[dict, ...] = ()
    conflict: Conflict | None = None
    achievable: dict | None = None
    wall_s: float = 0.0  # wall time of the explanation (its what-if solves), s


def metric(p: Problem, r: OptionResult) -> float | None:
    """``p.objective``'s figure for one option used alone (higher is better), None if it cannot
    be built."""
    if not r.feasible:
        return None
    return p.objective.metric(p, r)


def limit_text(p: Problem, r: OptionResult) -> str:
    """Why the option holds no more sessions per card (one sentence)."""
    f = r.figures
    if f is None:
        return "; ".join(r.violations.values())
    n = r.sessions_per_card
    if r.limit == "memory":
        free = p.hw.memory_bytes - f.hbm_used
        return (f"HBM capacity: {f.weights_per_card / GB:.1f} GB weights + {p.reserve_bytes / GB:.2f} GB reserve + "
                f"{n} x {f.kv_per_session / GB:.3f} GB KV = {f.hbm_used / GB:.2f} of {p.hw.memory_bytes / GB:g} GB; "
                f"one more session needs {f.kv_per_session / GB:.3f} GB, {free / GB:.3f} GB free")
    if r.limit == "slo":
        nxt = evaluate_step(p, r, n + 1)
        return (f"step time: {n + 1} sessions per card would take {nxt * 1e3:.3f} ms > "
                f"{p.slo_s * 1e3:g} ms per token")
    if r.limit == "host_capacity":
        return f"host memory per server: {r.host_bytes_per_server / GB:,.1f} GB used"
    if r.limit == "pool_capacity":
        return f"memory pool: one instance uses {r.pool_bytes / GB:,.1f} GB"
    return "no limit reached"


def evaluate_step(p: Problem, r: OptionResult, n: int) -> float:
    from optimizer.supernode.perf import figures

    return figures(p, r.option, n).step


def step_text(f) -> str:
    parts = {"HBM reads": f.t_hbm, "compute": f.t_compute, "KV tier": f.t_kv}
    top = max(parts, key=parts.get)
    return (f"step {f.step * 1e3:.2f} ms = max(HBM reads {f.t_hbm * 1e3:.2f}, compute {f.t_compute * 1e3:.2f}"
            + (f", KV tier {f.t_kv * 1e3:.2f}" if f.t_kv else "") + f") ms [{top} bound] + All-to-All "
            f"{f.t_comm * 1e3:.2f} ms" + (f" + prefetch excess {f.prefetch_excess * 1e3:.3f} ms"
                                          if f.prefetch_excess else ""))


def bytes_out(p: Problem, r: OptionResult) -> float:
    """Bytes leaving each card in one All-to-All at the option's batch: ``N d (S-1)/S``."""
    S = r.option.size
    return r.sessions_per_card * p.inventory.dispatch_bytes_per_token * (S - 1) / S


def skew_text(p: Problem, r: OptionResult) -> str:
    """``""`` without ``supernode.expert_load``; else the skew's effect on the option's All-to-All:
    the busiest card's share against ``1/S`` and the All-to-All against a uniform one."""
    if p.expert_load is None or r.figures is None:
        return ""
    S = r.option.size
    uniform = dataclasses.replace(p, expert_load=None)
    t_u = float(a2a_time(uniform, r.option, float(r.sessions_per_card)))
    ratio = p.expert_load.busiest_card_ratio(S)
    return (f"; expert-load skew: busiest card {ratio:.2f}x the uniform 1/{S} share (mean over "
            f"{p.expert_load.layers} trace layers), All-to-All {r.figures.t_a2a * 1e6:.2f} vs {t_u * 1e6:.2f} us uniform")


def fabric_busiest(p: Problem, r: OptionResult) -> str:
    """The candidate fabric's busiest link in one All-to-All at the option's batch, in words."""
    from optimizer.supernode.fabric import busiest_text

    c = p.fabric.candidates[r.option.candidate]
    return f"{r.fabric.label}; busiest link {busiest_text(p.fabric, c, r.fabric, bytes_out(p, r))}"


def budget_cut(p: Problem, r: OptionResult) -> tuple[str, str, str] | None:
    """``(key, text, short)`` when the fabric's shared limits (``switch_chips[total]``,
    ``fabric_power[total]``) cannot hold the domains of option ``r`` the plan needs (one, or
    enough for ``target_sessions``); None otherwise."""
    from constraints.supernode import fabric_budget as fb

    fs, fg = p.fabric, r.fabric
    if fg is None or not r.feasible or r.sessions_instance < 1:
        return None
    need = 1 if p.target_sessions is None else max(1, math.ceil(p.target_sessions / r.sessions_instance))
    if fs.max_switch_chips is not None and need * fb.chips(r) > fs.max_switch_chips:
        return (str(fb.CHIPS), f"{fb.CHIPS}: {need} domain(s) x {fb.chips(r):,} switch chips > at most "
                               f"{fs.max_switch_chips:,}", f"switch_chips: {need * fb.chips(r):,} > {fs.max_switch_chips:,}")
    if fs.max_power_w is not None and need * fb.power_w(r) > math.floor(fs.max_power_w + 1e-9):
        return (str(fb.POWER), f"{fb.POWER}: {need} domain(s) x {fb.power_w(r) / 1e3:,.3f} kW > at most "
                               f"{fs.max_power_w / 1e3:g} kW",
                f"fabric_power: {need * fb.power_w(r) / 1e3:,.2f} > {fs.max_power_w / 1e3:g} kW")
    return None


def fabric_why_short(p: Problem, r: OptionResult, chosen: OptionResult) -> str | None:
    """:func:`fabric_why` in a few words for the table (``pairwise state > 256 KiB NIC cache beyond
    8 hosts``, ``leaf uplinks 400 GB/s bind: N 193 < 201``)."""
    fg = r.fabric
    c = p.fabric.candidates[r.option.candidate]
    if "fabric_ports" in r.violations:
        return "cannot be built: " + r.violations["fabric_ports"].split(":")[0].split(",")[0]
    if "connection_state" in r.violations:
        return f"{c.organisation} state > {p.fabric.cache_bytes / 1024:g} KiB cache beyond {fg.state_max_hosts:,} hosts"
    cut = budget_cut(p, r)
    if cut is not None:
        return cut[2]
    if r.feasible and r.limit == "slo" and r.sessions_per_card < chosen.sessions_per_card:
        if "leaf" in fg.busiest_link:
            what = f"leaf uplinks {c.up_ports * fg.link_bandwidth / 1e9:g} GB/s bind"
        elif c.kind == "torus":
            what = f"torus links {fg.link_bandwidth / 1e9:g} GB/s bind"
        else:
            what = "card ports bind"
        return f"{what}: N {r.sessions_per_card} < {chosen.sessions_per_card}"
    return None


def fabric_why(p: Problem, r: OptionResult, chosen: OptionResult) -> str | None:
    """Why a candidate fabric lost to the chosen one when a fabric limit decides it (None
    otherwise): a violated limit (``pairwise state exceeds the 256 KiB NIC cache beyond 8
    hosts``) or the per-token target with the binding link (``leaf 0 up: uplinks 16 x 25 =
    400 GB/s per plane ... binds``)."""
    from optimizer.supernode.fabric import busiest_text

    fg = r.fabric
    c = p.fabric.candidates[r.option.candidate]
    if "fabric_ports" in r.violations:
        return f"cannot be built: fabric_ports: {r.violations['fabric_ports']}"
    if "connection_state" in r.violations:
        return (f"connection_state: {c.organisation} state {fg.state_bytes / 1024:,.1f} KiB exceeds the {p.fabric.cache_bytes / 1024:g} "
                f"KiB NIC cache beyond {fg.state_max_hosts:,} hosts ({fg.hosts} here)")
    cut = budget_cut(p, r)
    if cut is not None:
        return cut[1]
    if r.feasible and r.limit == "slo" and r.sessions_per_card < chosen.sessions_per_card:
        return (f"per-token target holds N to {r.sessions_per_card} < {chosen.sessions_per_card}; All-to-All "
                f"{busiest_text(p.fabric, c, fg, bytes_out(p, r))}")
    return None


def bindings(p: Problem, res: SupernodeSolution) -> list[Binding]:
    """Limits that bind (or nearly bind) at the plan, each with its slack."""
    ev = res.evaluation
    out: list[Binding] = []
    out.append(Binding(sn_cards.KEY, p.cards - ev.cards_used, "cards",
                       f"{ev.cards_used} of {p.cards} cards used"))
    if p.target_sessions is not None:
        out.append(Binding(sn_target.KEY, ev.sessions - p.target_sessions, "sessions",
                           f"{ev.sessions:,} sessions for a target of {p.target_sessions:,}"))
    pool_used = sum(res.results[j].pool_bytes * c for j, c in res.plan.counts.items())
    if pool_used > 0:
        cap = p.hw.tiers["pool"].capacity_bytes
        out.append(Binding(sn_pool.KEY, round((cap - pool_used) / GB, 6), "GB",
                           f"{pool_used / GB:,.1f} of {cap / GB:,.0f} GB of the memory pool used"))
    for j in sorted(res.plan.counts):
        r = res.results[j]
        f, lab = r.figures, r.option.label(p)
        if r.limit == "memory":
            out.append(Binding(ConstraintKey("memory", lab), round((p.hw.memory_bytes - f.hbm_used) / GB, 6), "GB",
                               limit_text(p, r)))
        elif r.limit == "slo":
            out.append(Binding(ConstraintKey("slo", lab), round((p.slo_s - f.step) * 1e3, 6), "ms",
                               limit_text(p, r)))
        elif r.limit in ("host_capacity", "pool_capacity"):
            cap = p.hw.tiers["host" if r.limit == "host_capacity" else "pool"].capacity_bytes
            used = r.host_bytes_per_server if r.limit == "host_capacity" else r.pool_bytes
            out.append(Binding(ConstraintKey("tier_capacity" if r.limit == "host_capacity" else "pool_capacity", lab),
                               round((cap - used) / GB, 6), "GB", limit_text(p, r)))
        if r.limit != "slo":
            out.append(Binding(ConstraintKey("slo", lab), round((p.slo_s - f.step) * 1e3, 6), "ms",
                               f"{step_text(f)}, target {p.slo_s * 1e3:g} ms"))
        out.append(Binding(ConstraintKey("all_to_all", lab), round(f.t_comm * 1e3, 6), "ms",
                           f"2 x {p.inventory.moe_layers} MoE layers x {f.t_a2a * 1e6:.2f} us "
                           f"= {f.t_comm / f.step:.0%} of the step"
                           + (" (NVLink)" if r.option.fabric == SCALE_UP else
                              f" ({fabric_busiest(p, r)})" if r.fabric is not None else
                              " (NVLink inside a server, NIC across)") + skew_text(p, r)))
        if r.fabric is not None:
            fg = r.fabric
            cache = p.fabric.cache_bytes
            org = p.fabric.candidates[r.option.candidate].organisation
            out.append(Binding(ConstraintKey("connection_state", lab), round((cache - fg.state_bytes) / 1024, 6), "KiB",
                               f"{org} state {fg.state_bytes / 1024:,.2f} KiB per NIC for {fg.hosts} hosts of "
                               f"{cache / 1024:g} KiB; {org} fits up to {fg.state_max_hosts:,} hosts"))
        for tier, d in f.prefetch.items():
            out.append(Binding(ConstraintKey("prefetch", f"{tier}, {lab}"), round((d["window_s"] - d["fetch_s"]) * 1e6, 6),
                               "us", f"rows from {tier} arrive in {d['fetch_s'] * 1e6:.2f} us; window "
                                     f"{d['window_s'] * 1e6:.2f} us ({d['layer']} block(s) of the step)"
                               + (f"; the excess {d['excess_s'] * 1e6:.2f} us adds to the step" if d["excess_s"] else "")))
            if tier == "host":
                h = p.hw.tiers["host"]
                rows = r.sessions_per_card * p.hw.server_cards * sum(
                    t.rows_per_token for t, tn in zip(p.inventory.tables, r.option.tables) if tn == "host")
                rate = rows / f.step
                out.append(Binding(ConstraintKey("host_rate", lab), round(h.reads_per_s - rate, 3), "reads/s",
                                   f"{rate:,.0f} random reads/s per server of {h.reads_per_s:,.0f}"))
    return out


def alternatives(p: Problem, res: SupernodeSolution, limit: int = 16) -> list[dict[str, Any]]:
    """The best option of every size and fabric, and every other placement at the chosen size,
    each with its figures and why it lost (or ``chosen``)."""
    obj = res.objective
    chosen = set(res.plan.counts)
    best_chosen = max((metric(p, res.results[j]) for j in chosen), default=None)
    groups: dict[tuple, list[int]] = {}
    for j, r in enumerate(res.results):
        groups.setdefault((r.option.size, r.option.fabric, r.option.candidate if r.option.candidate is not None
                           else -1), []).append(j)
    picks: list[int] = []
    for key, idx in sorted(groups.items()):
        feas = [j for j in idx if res.results[j].feasible]
        if chosen & set(idx):
            picks.append(min(chosen & set(idx)))
        elif feas:
            picks.append(max(feas, key=lambda j: (metric(p, res.results[j]), -j)))
        else:
            picks.append(idx[0])
    chosen_sizes = {(res.results[j].option.size, res.results[j].option.fabric, res.results[j].option.candidate)
                    for j in chosen}
    seen_place = set()
    for j, r in enumerate(res.results):
        if (r.option.size, r.option.fabric, r.option.candidate) in chosen_sizes and j not in picks:
            place = (r.option.tables, r.option.kv)
            if place not in seen_place and r.feasible:
                seen_place.add(place)
                picks.append(j)
    out = []
    if p.fabric is not None and p.fabric.generated:  # every generated candidate is shown (the report may fold them)
        limit += len(groups)
    for j in picks[:limit]:
        r = res.results[j]
        f = r.figures
        m = metric(p, r)
        if j in chosen:
            why = short = "chosen"
        elif m is None:
            why = "cannot be built: " + "; ".join(f"{k}: {v}" for k, v in r.violations.items())
            short = "cannot be built: " + ", ".join(r.violations)
        elif best_chosen is not None and m < best_chosen - 1e-9:
            why = f"{obj.metric_text(p, r)} against {obj.metric_text(p, res.results[min(chosen)])}"
            short = f"worse {obj.name}; {LIMIT_NAMES.get(r.limit, r.limit)} limits N"
        else:
            why = f"equal {obj.metric_text(p, r)}; lost the secondary objective or the tie-break"
            short = "tie on the objective; lost the secondary or the tie-break"
        if r.fabric is not None and j not in chosen:
            ch = res.results[min(chosen)]
            fw = fabric_why(p, r, ch)
            if fw is not None:
                why, short = fw, fabric_why_short(p, r, ch)
            elif ch.fabric is not None and r.fabric.cost_usd > ch.fabric.cost_usd and m is not None:
                short = f"{obj.name}: fabric {r.fabric.cost_usd - ch.fabric.cost_usd:+,.0f} USD"
        out.append({
            "option": r.option.label(p), "size": r.option.size, "fabric": r.option.fabric,
            "tables": dict(zip([t.name for t in p.inventory.tables], r.option.tables)), "kv": r.option.kv,
            "feasible": r.feasible, "sessions_per_card": r.sessions_per_card,
            "weights_per_card_gb": r.weights_per_card / GB,
            "step_ms": None if f is None else f.step * 1e3,
            "tokens_per_s_per_card": None if f is None else f.tokens_per_s_card,
            "single_user_ms": r.single.token * 1e3 if math.isfinite(r.single.token) else None,  # None: no fabric
            "limited_by": LIMIT_NAMES.get(r.limit, r.limit) if f is not None else None,
            "limit_detail": limit_text(p, r),
            "why": why,
            "why_short": short,
            **({"fabric_figures": fabric_dict(p, r)} if r.fabric is not None else {}),
        })
    return out


def fabric_dict(p: Problem, r: OptionResult) -> dict[str, Any]:
    """A candidate fabric's counts and figures for the report (links, switch chips, worst-case
    hops, busiest link, connection state, cost, power)."""
    fg = r.fabric
    c = p.fabric.candidates[r.option.candidate]
    d = {"candidate": c.label, "topology": c.topology_label(), "organisation": c.organisation,
         "links": fg.links, "port_links": fg.port_links, "switch_chips": fg.switch_chips,
         "max_hops": fg.max_hops, "max_chips": fg.max_chips, "link_bandwidth_gb_s": fg.link_bandwidth / 1e9,
         "hosts": fg.hosts, "connection_state_kib": fg.state_bytes / 1024,
         "connection_state_max_hosts": fg.state_max_hosts, "cost_usd": fg.cost_usd, "power_kw": fg.power_w / 1e3}
    if "fabric_ports" not in r.violations:
        b = bytes_out(p, r) if r.sessions_per_card else 0.0
        d.update(busiest_link=fg.busiest_link, busiest_link_gb_s=fg.busiest_link_bandwidth / 1e9,
                 a2a_us=None if r.figures is None else r.figures.t_a2a * 1e6,
                 busiest_link_mb=b * fg.a2a_s_per_byte * fg.busiest_link_bandwidth / 1e6)
    return d


# ------------------------------------------------------------------ flip thresholds
def _with_tier(p: Problem, tier: str, param: str, value: float) -> Problem:
    t = p.hw.tiers[tier]
    if param == "round_trip_us":
        new = dataclasses.replace(t, latency_s=value * 1e-6)
        if tier == "pool":
            d = t.detail
            bw = d["path_bandwidth_gb_s"] * GB
            if value > 0:
                bw = min(bw, d["in_flight"] * t.transaction_bytes / (value * 1e-6))
            new = dataclasses.replace(new, bandwidth=bw)
    elif param == "latency_per_hop_us":
        new = dataclasses.replace(t, latency_s=value * 1e-6 * t.detail["hops"],
                                  detail=dict(t.detail, latency_per_hop_us=value))
    else:
        raise KeyError(param)
    return dataclasses.replace(p, hw=dataclasses.replace(p.hw, tiers=dict(p.hw.tiers, **{tier: new})))


def _placement(res: SupernodeSolution) -> tuple:
    return tuple(sorted({(b.option.tables, b.option.kv) for b in res.plan.instances}))


def flip_thresholds(p: Problem, res: SupernodeSolution, budget: Budget, steps: int = 12) -> list[dict[str, Any]]:
    """Parameter values at which the chosen tiers change (e.g. exercise 6-11(f): the ROM per-hop
    latency or the host round trip), by bisection on re-solves with that parameter changed.

    A tier the plan uses is made slower (up to 10^4 times the given value) until the placement
    changes; a tier it does not use is made faster (down to 0). Assumes one flip on that range.
    The bisection stops at ``budget``'s deadline (every re-solve gets at least 0.5 s).
    """
    used_tiers = set()
    for tiers in p.table_tiers.values():
        used_tiers |= set(tiers)
    # KV timing uses a tier's bandwidth only; latencies matter for the table lookups
    params = []
    if "host" in p.hw.tiers and "host" in used_tiers:
        params.append(("host", "round_trip_us", p.hw.tiers["host"].latency_s * 1e6))
    if "pool" in p.hw.tiers and "pool" in used_tiers:
        params.append(("pool", "round_trip_us", p.hw.tiers["pool"].latency_s * 1e6))
    if "rom" in p.hw.tiers and "rom" in used_tiers and p.hw.tiers["rom"].detail.get("hops"):
        params.append(("rom", "latency_per_hop_us", p.hw.tiers["rom"].detail["latency_per_hop_us"]))
    if not params:
        return []
    base = _placement(res)
    out = []
    for tier, param, value in params:
        in_plan = any(tier in k[0] or tier == k[1] for k in base)

        def decide(v: float):
            p2 = _with_tier(p, tier, param, v)
            results = [r if tier not in r.option.tables and r.option.kv != tier else evaluate_option(p2, r.option)
                       for r in res.results]
            r2 = solve(p2, budget.split(1.0, at_least_s=0.5), results=results)
            return None if r2.plan is None else _placement(r2), r2

        lo, hi = (value, max(value, 1e-3) * 1e4) if in_plan else (0.0, value)
        far, far_res = decide(hi if in_plan else lo)
        entry = {"tier": tier, "parameter": param, "given": value, "unit": "us"}
        if far == base:
            entry.update(threshold=None, detail=f"the placement does not change for {tier} {param} from "
                                                f"{min(lo, hi):g} to {max(lo, hi):g} us")
            out.append(entry)
            continue
        a, b = (lo, hi)  # a keeps the base placement (in_plan) / b keeps it (not in_plan)
        for _ in range(steps):
            if budget.expired():
                budget.note_cut("supernode flip thresholds")
                break
            mid = math.sqrt(a * b) if in_plan and a > 0 else (a + b) / 2
            if (decide(mid)[0] == base) == in_plan:
                a = mid
            else:
                b = mid
        flip = b if in_plan else a
        new_res = decide(flip)[1]
        new_place = ", ".join(f"tables {','.join(k[0])} KV {k[1]}" for k in (_placement(new_res) if new_res.plan else []))
        entry.update(threshold=flip, bracket=[min(a, b), max(a, b)],
                     detail=f"{tier} {param} {'above' if in_plan else 'below'} about {flip:.4g} us changes the "
                            f"placement to {new_place or 'no plan'}")
        out.append(entry)
    return out


def conflict_details(p: Problem, keys: tuple[ConstraintKey, ...]) -> list[str]:
    """Readable lines for the conflicting keys, one per family (at most three options shown),
    each from the owning family's ``describe``."""
    lines = []
    fams: dict[str, list[ConstraintKey]] = {}
    for k in keys:
        fams.setdefault(k.family, []).append(k)
    for fam, ks in sorted(fams.items()):
        if ks[0] == sn_pool.KEY:  # the pool's shared capacity; other pool_capacity keys are per option
            lines.append(f"{ks[0]}: {sn_pool.describe(ks[0], p)}")
            continue
        try:
            mod = family_module(fam)
        except KeyError:
            lines.extend(str(k) for k in ks)
            continue
        if len(mod.KEY_FAMILIES) > 1:  # per-option families: the options, summarised
            shown = [mod.describe(k, p) for k in ks[:3]]
            more = f" (and {len(ks) - 3} more options)" if len(ks) > 3 else ""
            lines.append(f"{fam}: " + " | ".join(shown) + more)
        else:
            lines.append(f"{ks[0]}: {mod.describe(ks[0], p)}")
    return lines


def achievable(p: Problem, res: SupernodeSolution) -> dict | None:
    """For an infeasible run: the best any option reaches on what failed — the sessions all the
    cards can hold within the per-token target (with ``target_sessions``), else the fastest batch-1
    token any option has against the target."""
    built = [r for r in res.results if r.feasible and r.sessions_per_card > 0]
    if built and p.target_sessions is not None:
        most = max(r.sessions_per_card * p.cards for r in built)
        return {"requirement": "target_sessions", "best": most, "required": p.target_sessions,
                "detail": f"at most {most:,} sessions fit the {p.cards} cards within the limits; "
                          f"{p.target_sessions:,} required"}
    if not res.results:
        return None
    # among the options the target alone rules out (an option short of memory is no answer: a
    # fresh user was pointed to one 21 GB short)
    buildable = [r for r in res.results if set(r.violations) <= {"slo"}]
    if not buildable:
        fams = sorted({f for r in res.results for f in r.violations})
        return {"requirement": "options", "best": None, "required": None,
                "detail": "no option fits memory and the other limits even with one session per card"
                          + (f" (limits broken: {', '.join(fams)})" if p.fabric is not None else "")}
    fastest = min(buildable, key=lambda r: r.single.token)
    t = fastest.single.token * 1e3
    return {"requirement": "slo_ms_per_token", "best": t, "required": p.slo_s * 1e3,
            "detail": f"the fastest option that fits ({fastest.option.label(p)}) needs {t:.3f} ms per token even at "
                      f"batch 1" + (f" > {p.slo_s * 1e3:g} ms target" if t > p.slo_s * 1e3 else
                                    f"; no option fits memory and the {p.slo_s * 1e3:g} ms target with a session")}


def explain(p: Problem, res: SupernodeSolution, budget: Budget, thresholds: bool = True) -> SupernodeExplanation:
    """The explanation of a solution. A plan: binding limits, alternatives and (``thresholds``)
    flip thresholds by re-solves within ``budget`` (at most ``THRESHOLD_TIME_S``, at least
    ``MIN_THRESHOLD_S``). No plan: the conflict (infeasible) and what is achievable."""
    if res.plan is None:
        conflict = None
        if res.status == Status.INFEASIBLE:
            conflict = Conflict(list(res.conflict), conflict_details(p, res.conflict) or ["the limits cannot all hold"])
        return SupernodeExplanation(conflict=conflict, achievable=achievable(p, res))
    flips: list[dict[str, Any]] = []
    if thresholds:
        flips = flip_thresholds(p, res, budget.split(1.0, at_least_s=MIN_THRESHOLD_S).within(THRESHOLD_TIME_S))
    return SupernodeExplanation(binding=tuple(bindings(p, res)), alternatives=tuple(alternatives(p, res)),
                                thresholds=tuple(flips))
