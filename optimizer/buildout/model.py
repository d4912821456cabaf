"""The build-out CP-SAT model: variables, bounds and the named constraint families.

Integer units: power in watts, cost in hundredths of the cost unit (see
:mod:`optimizer.buildout.schema`). Variables (all integer):

* ``n[t]`` servers of type t, ``k[t]`` install units of type t;
* ``y[p]`` racks filled by rack pattern p (:mod:`optimizer.buildout.patterns`);
* with a fabric: ``z`` (second tier built), ``l1`` one-tier leaf chips, ``w[d]`` two-tier
  leaf chips with split d, ``s`` spine chips (:mod:`constraints.buildout.fabric`).

Constraint families live in ``constraints/buildout_*.py``; each module's ``add(nm, ctx)``
adds its constraints under :class:`~optimizer.result.ConstraintKey` names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil
from typing import Any

from ortools.sat.python import cp_model

from constraints.buildout import fabric as buildout_fabric
from constraints.buildout import install_unit as buildout_install_unit
from constraints.buildout import max_count as buildout_max_count
from constraints.buildout import power as buildout_power
from constraints.buildout import rack_power as buildout_rack_power
from constraints.buildout import rack_units as buildout_rack_units
from constraints.buildout import racks as buildout_racks
from constraints.buildout import second_tier as buildout_second_tier
from constraints.buildout import target as buildout_target
from optimizer.buildout.patterns import RackPattern, rack_patterns
from optimizer.buildout.schema import Problem
from optimizer.cpsat import NamedModel

FAMILIES = {
    "power": buildout_power,
    "second_tier": buildout_second_tier,
    "install_unit": buildout_install_unit,
    "max_count": buildout_max_count,
    "target": buildout_target,
    "rack_power": buildout_rack_power,
    "rack_units": buildout_rack_units,
    "rack_cover": buildout_racks,
    "fabric": buildout_fabric,
}


def family_module(family: str):
    """The constraints module that owns a family name (for descriptions)."""
    if family in FAMILIES:
        return FAMILIES[family]
    if family.startswith("fabric"):
        return buildout_fabric
    raise KeyError(family)


@dataclass
class Ctx:
    """Everything a constraint or objective module needs: the problem, variables, bounds."""

    problem: Problem
    n: dict[str, Any]
    k: dict[str, Any]
    patterns: list[RackPattern]
    y: list[Any]
    z: Any
    splits: list[tuple[int, int]] = field(default_factory=list)
    w: list[Any] = field(default_factory=list)
    l1: Any = 0
    s: Any = 0
    n_ub: dict[str, int] = field(default_factory=dict)
    gpus_ub: int = 0
    leaf_ub: int = 0

    @property
    def gpus(self):
        return sum(t.gpus * self.n[t.name] for t in self.problem.types)

    @property
    def power_w(self):
        p = self.problem
        tier2 = p.fabric.second_tier_power_w * self.z if p.fabric is not None else 0
        return p.fixed_w + sum(t.power_w * self.n[t.name] for t in p.types) + tier2

    @property
    def cost_c(self):
        return sum(t.cost_c * self.n[t.name] for t in self.problem.types)

    def racks(self, cooling: str | None = None):
        return sum(y for pat, y in zip(self.patterns, self.y) if cooling in (None, pat.cooling))

    @property
    def leaves(self):
        return self.l1 + sum(self.w)

    @property
    def uplinks(self):
        return sum(u * w for (_d, u), w in zip(self.splits, self.w))


def server_bounds(p: Problem, min_gpus: int = 0) -> dict[str, int]:
    """Upper bound on the servers of each type, a multiple of the install unit.

    Large enough never to bind on its own: the power budget alone allows no more, and a
    target (or ``min_gpus``, used by what-if solves without the budget) is reachable by any
    single type. Capacity limits (power, max_count) stay named constraints so that an
    infeasible instance names them.
    """
    u = p.install_unit_servers
    avail = max(0, p.budget_w - p.fixed_w)
    need = max(p.target_gpus or 0, min_gpus)
    out = {}
    for t in p.types:
        ub = max(avail // t.power_w, ceil(need / t.gpus))
        out[t.name] = ceil(ub / u) * u
    return out


def build(p: Problem, explain: bool = False, omit: frozenset[str] = frozenset(),
          min_gpus: int = 0) -> tuple[NamedModel, Ctx]:
    """Build the model.

    Args:
        p: the resolved problem.
        explain: build the explain-mode model (one assumption literal per key).
        omit: constraint families to leave out (what-if solves, e.g. {"power"}).
        min_gpus: widen the server bounds so that this many GPUs are representable.
    Returns:
        (named model, context with variables).
    """
    nm = NamedModel(explain=explain)
    m = nm.model
    n_ub = server_bounds(p, min_gpus)
    u = p.install_unit_servers
    n = {t.name: m.new_int_var(0, n_ub[t.name], f"n[{t.name}]") for t in p.types}
    k = {t.name: m.new_int_var(0, n_ub[t.name] // u, f"k[{t.name}]") for t in p.types}
    pats = rack_patterns([t.power_w for t in p.types], [t.rack_units for t in p.types],
                         [n_ub[t.name] for t in p.types], p.cooling_limits_w(), p.rack_units)
    racks_ub = max(1, sum(n_ub.values()))
    y = [m.new_int_var(0, racks_ub, f"y[{i}:{pat.cooling}:{pat.counts}]") for i, pat in enumerate(pats)]
    gpus_ub = sum(t.gpus * n_ub[t.name] for t in p.types)
    ctx = Ctx(problem=p, n=n, k=k, patterns=pats, y=y, z=0, n_ub=n_ub, gpus_ub=gpus_ub)
    if p.fabric is not None:
        f = p.fabric
        ctx.z = m.new_bool_var("z[second tier]")
        ctx.splits = buildout_fabric.leaf_splits(f.switch_radix, f.max_oversubscription)
        ctx.leaf_ub = max(1, f.gpu_links * gpus_ub)
        ctx.l1 = m.new_int_var(0, ctx.leaf_ub, "leaf[one tier]")
        ctx.w = [m.new_int_var(0, ceil(ctx.leaf_ub / d), f"leaf[{d}down/{up}up]") for d, up in ctx.splits]
        ctx.s = m.new_int_var(0, ctx.leaf_ub, "spine")
    if u == 1:
        for t in p.types:  # k is unused; tie it to n so it reports install units
            m.add(k[t.name] == n[t.name])
    for family, mod in FAMILIES.items():
        if family not in omit:
            mod.add(nm, ctx)
    return nm, ctx


def installed_racks(p, racks: list[tuple[RackPattern, int]], servers: list[int]) -> list[tuple[RackPattern, int]]:
    """The racks as installed: the model covers the servers with *maximal* patterns
    (``≥``), so the last racks of each type give back the servers the plan does not have.

    Args:
        racks: (maximal pattern, number of such racks).
        servers: servers per type in the plan.
    Returns:
        (rack content, number of such racks) holding exactly ``servers``; a rack left empty
        is dropped (the fewest-racks stage never leaves one).
    """
    single = [[pat.cooling, list(pat.counts)] for pat, mult in racks for _ in range(mult)]
    for i, want in enumerate(servers):
        extra = sum(r[1][i] for r in single) - want
        for r in reversed(single):  # take the surplus back from the last racks
            if extra <= 0:
                break
            take = min(extra, r[1][i])
            r[1][i] -= take
            extra -= take
    grouped: dict[tuple, int] = {}
    for cooling, counts in single:
        if any(counts):
            grouped[(cooling, tuple(counts))] = grouped.get((cooling, tuple(counts)), 0) + 1
    out = []
    for (cooling, counts), mult in grouped.items():
        power = sum(c * t.power_w for c, t in zip(counts, p.types))
        units = sum(c * t.rack_units for c, t in zip(counts, p.types))
        out.append((RackPattern(cooling, counts, power, units), mult))
    return out


def values(solver: cp_model.CpSolver, ctx: Ctx) -> dict[str, Any]:
    """Read a solution: servers, install units, rack patterns used, fabric chips."""
    p = ctx.problem
    out: dict[str, Any] = {
        "servers": {t.name: int(solver.value(ctx.n[t.name])) for t in p.types},
        "install_units": {t.name: int(solver.value(ctx.k[t.name])) for t in p.types},
        "racks": installed_racks(p, [(pat, int(solver.value(y))) for pat, y in zip(ctx.patterns, ctx.y)
                                     if solver.value(y) > 0],
                                 [int(solver.value(ctx.n[t.name])) for t in p.types]),
        "second_tier": bool(solver.value(ctx.z)) if p.fabric is not None else False,
    }
    if p.fabric is not None:
        out["leaves_one_tier"] = int(solver.value(ctx.l1))
        out["leaves_split"] = [(d, up, int(solver.value(w))) for (d, up), w in zip(ctx.splits, ctx.w)
                               if solver.value(w) > 0]
        out["spine"] = int(solver.value(ctx.s))
    return out
