"""The build-out CP-SAT model: variables, bounds and the named constraint families.

Integer units: power in watts, cost in hundredths of the cost unit (see
:mod:`optimizer.buildout.schema`). Variables (all integer):

* ``n[t]`` servers of type t, ``k[t]`` install units of type t;
* ``y[p]`` racks filled by rack pattern p (:mod:`optimizer.buildout.patterns`); the items a
  pattern counts are the server types and, when switch chips take rack units or power
  (``fabric.switch_rack_units``/``switch_power_kw``), the switch chips as one more kind;
* with ``scale_up_domains``: ``domains`` (scale-up domains built, each with its fabric's chips,
  links, power and cost; :mod:`constraints.buildout.scale_up_domains`);
* with a fabric: ``z`` (second tier built), ``l1`` one-tier leaf chips, ``w[d]`` two-tier
  leaf chips with split d, ``s`` spine chips (:mod:`constraints.buildout.fabric`).

Constraint families live in ``constraints/buildout/*.py``; each module's
``define(model, problem)`` adds its constraints to a :class:`BuildoutModel` under
:class:`~optimizer.result.ConstraintKey` names, and ``describe(key, problem)`` explains one of
them in a line. :data:`FAMILIES` is the formulation: every family, in the order it is added.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from math import ceil
from typing import Any

from ortools.sat.python import cp_model

from constraints.buildout import fabric as buildout_fabric
from constraints.buildout import install_unit as buildout_install_unit
from constraints.buildout import max_count as buildout_max_count
from constraints.buildout import power as buildout_power
from constraints.buildout import rack_feed as buildout_rack_feed
from constraints.buildout import rack_power as buildout_rack_power
from constraints.buildout import rack_units as buildout_rack_units
from constraints.buildout import racks as buildout_racks
from constraints.buildout import second_tier as buildout_second_tier
from constraints.buildout import scale_up_domains as buildout_domains
from constraints.buildout import target as buildout_target
from optimizer.buildout.patterns import RackPattern, rack_patterns
from optimizer.buildout.plan import BuildoutPlan, LeafGroup, RackGroup
from optimizer.buildout.schema import Problem
from optimizer.cpsat import NamedModel

# the formulation: every constraint family of the build-out, in the order it is added
FAMILIES = (
    buildout_power,
    buildout_second_tier,
    buildout_install_unit,
    buildout_max_count,
    buildout_target,
    buildout_rack_power,
    buildout_rack_feed,
    buildout_rack_units,
    buildout_racks,
    buildout_fabric,
    buildout_domains,
)


def family_module(family: str):
    """The constraints module that owns a family name (a key's ``family``).

    Raises:
        KeyError: no module of :data:`FAMILIES` owns it.
    """
    for mod in FAMILIES:
        if family == mod.FAMILY or family in getattr(mod, "KEY_FAMILIES", ()):
            return mod
    raise KeyError(family)


SWITCHES = "switches"


def item_power_w(p: Problem) -> list[int]:
    """Watts per item kind in a rack: the server types, then switch chips when they are racked."""
    out = [t.power_w for t in p.types]
    if p.fabric is not None and p.fabric.switches_in_racks:
        out.append(p.fabric.switch_power_w)
    return out


def item_units(p: Problem) -> list[int]:
    """Rack units per item kind (same order as :func:`item_power_w`)."""
    out = [t.rack_units for t in p.types]
    if p.fabric is not None and p.fabric.switches_in_racks:
        out.append(p.fabric.switch_rack_units)
    return out


@dataclass
class BuildoutModel:
    """The build-out CP-SAT model: the named model, the problem, variables and bounds; what a
    constraint family (``define``) or an objective (``expr``) works on. Expressions are in
    model units (watts, hundredths of the cost unit)."""

    named: NamedModel
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
    domains: Any = 0  # scale-up domains built (an integer variable with ``scale_up_domains``)

    @property
    def cp(self) -> cp_model.CpModel:
        """The OR-Tools model."""
        return self.named.model

    def add(self, key, constraint):
        """Add ``constraint`` under ``key`` (see :meth:`optimizer.cpsat.NamedModel.add`)."""
        return self.named.add(key, constraint)

    def all_variables(self) -> list:
        """Every decision variable (for solution hints between stages)."""
        out = list(self.n.values()) + list(self.k.values()) + list(self.y) + list(self.w)
        for v in (self.z, self.l1, self.s, self.domains):
            if not isinstance(v, int):
                out.append(v)
        return out

    @property
    def gpus(self):
        return sum(t.gpus * self.n[t.name] for t in self.problem.types)

    @property
    def power_w(self):
        p = self.problem
        tier2 = p.fabric.second_tier_power_w * self.z if p.fabric is not None else 0
        chips = p.fabric.switch_power_w * (self.leaves + self.s) if p.fabric is not None else 0
        dom = p.domains.power_w * self.domains if p.domains is not None else 0
        return p.fixed_w + sum(t.power_w * self.n[t.name] for t in p.types) + tier2 + chips + dom

    @property
    def cost_c(self):
        dom = self.problem.domains.cost_c * self.domains if self.problem.domains is not None else 0
        return sum(t.cost_c * self.n[t.name] for t in self.problem.types) + dom

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


@lru_cache(maxsize=64)
def _patterns(power_w: tuple, units: tuple, caps: tuple, limits: tuple, rack_u: int) -> list[RackPattern]:
    """:func:`rack_patterns`, cached: the what-if solves of one run rebuild the same racks."""
    return rack_patterns(list(power_w), list(units), list(caps), dict(limits), rack_u)


def build(p: Problem, explain: bool = False, omit: frozenset[str] = frozenset(),
          min_gpus: int = 0) -> BuildoutModel:
    """Build the model.

    Args:
        p: the resolved problem.
        explain: build the explain-mode model (one assumption literal per key).
        omit: constraint families (module ``FAMILY`` names) to leave out (what-if solves, e.g.
            {"power"}).
        min_gpus: widen the server bounds so that this many GPUs are representable.
    Returns:
        The model with every family of :data:`FAMILIES` not in ``omit`` defined.
    """
    nm = NamedModel(explain=explain)
    m = nm.model
    n_ub = server_bounds(p, min_gpus)
    u = p.install_unit_servers
    n = {t.name: m.new_int_var(0, n_ub[t.name], f"n[{t.name}]") for t in p.types}
    k = {t.name: m.new_int_var(0, n_ub[t.name] // u, f"k[{t.name}]") for t in p.types}
    gpus_ub = sum(t.gpus * n_ub[t.name] for t in p.types)
    leaf_ub = 0
    caps = [n_ub[t.name] for t in p.types]
    if p.fabric is not None:
        # leaf and spine chips each stay within leaf_ub (their variable domains and the
        # fabric_tiers constraints), so a rack never needs more than 2 * leaf_ub chips
        leaf_ub = max(1, p.fabric.gpu_links * gpus_ub)
        if p.fabric.switches_in_racks:
            caps.append(2 * leaf_ub + 1)
    pats = _patterns(tuple(item_power_w(p)), tuple(item_units(p)), tuple(caps),
                     tuple(p.cooling_limits_w().items()), p.rack_units)
    racks_ub = max(1, sum(caps))
    y = [m.new_int_var(0, racks_ub, f"y[{i}:{pat.cooling}:{pat.counts}]") for i, pat in enumerate(pats)]
    model = BuildoutModel(named=nm, problem=p, n=n, k=k, patterns=pats, y=y, z=0, n_ub=n_ub, gpus_ub=gpus_ub)
    if p.fabric is not None:
        f = p.fabric
        model.z = m.new_bool_var("z[second tier]")
        model.splits = buildout_fabric.leaf_splits(f.switch_radix, f.max_oversubscription)
        model.leaf_ub = leaf_ub
        model.l1 = m.new_int_var(0, model.leaf_ub, "leaf[one tier]")
        model.w = [m.new_int_var(0, ceil(model.leaf_ub / d), f"leaf[{d}down/{up}up]") for d, up in model.splits]
        model.s = m.new_int_var(0, model.leaf_ub, "spine")
    if p.domains is not None:
        model.domains = m.new_int_var(0, max(1, ceil(gpus_ub / p.domains.cards)), "scale_up_domains")
    if u == 1:
        for t in p.types:  # k is unused; tie it to n so it reports install units
            m.add(k[t.name] == n[t.name])
    for family in FAMILIES:
        if family.FAMILY not in omit:
            family.define(model, p)
    return model


def installed_racks(p, racks: list[tuple[RackPattern, int]], items: list[int]) -> list[tuple[RackPattern, int]]:
    """The racks as installed: the model covers the servers with *maximal* patterns
    (``>=``), so the last racks of each type give back the servers the plan does not have.

    Works on groups of identical racks (``O(groups x types)``, independent of the number of
    racks): taking a surplus back from a group of ``m`` racks empties whole racks from its
    end and at most one rack partly, so a group splits into at most three groups.

    Args:
        racks: (maximal pattern, number of such racks), in model order.
        items: items per kind in the plan: servers per type, then switch chips when they are
            racked (``len(items) == len(pattern.counts)``).
    Returns:
        (rack content, number of such racks) holding exactly ``items``, groups with equal
        content merged in order of first appearance; a rack left empty is dropped (the
        fewest-racks stage never leaves one).
    """
    groups = [(pat.cooling, list(pat.counts), mult) for pat, mult in racks if mult > 0]
    for i, want in enumerate(items):
        extra = sum(c[i] * m for _cool, c, m in groups) - want
        j = len(groups) - 1
        while extra > 0 and j >= 0:  # take the surplus back from the last racks first
            cooling, counts, mult = groups[j]
            per = counts[i]
            if per == 0:
                j -= 1
                continue
            full, part = divmod(min(extra, per * mult), per)
            extra -= full * per + part
            split = []
            keep = mult - full - (1 if part else 0)
            if keep:
                split.append((cooling, counts, keep))
            if part:
                split.append((cooling, counts[:i] + [per - part] + counts[i + 1:], 1))
            if full:
                split.append((cooling, counts[:i] + [0] + counts[i + 1:], full))
            groups[j:j + 1] = split
            j -= 1
    grouped: dict[tuple, int] = {}
    for cooling, counts, mult in groups:
        if any(counts):
            key = (cooling, tuple(counts))
            grouped[key] = grouped.get(key, 0) + mult
    out = []
    for (cooling, counts), mult in grouped.items():
        power = sum(c * w for c, w in zip(counts, item_power_w(p)))
        units = sum(c * u for c, u in zip(counts, item_units(p)))
        out.append((RackPattern(cooling, counts, power, units), mult))
    return out


def values(solver: cp_model.CpSolver, model: BuildoutModel) -> BuildoutPlan:
    """Read a solution: servers, install units, racks as installed (:func:`installed_racks`),
    fabric chips."""
    p = model.problem
    val = solver.value
    servers = {t.name: int(val(model.n[t.name])) for t in p.types}
    items = [servers[t.name] for t in p.types]
    leaves: list[LeafGroup] = []
    spine = 0
    if p.fabric is not None:
        one_tier = int(val(model.l1))
        if one_tier:
            leaves.append(LeafGroup(p.fabric.switch_radix, 0, one_tier))
        leaves += [LeafGroup(d, up, int(val(w))) for (d, up), w in zip(model.splits, model.w) if val(w) > 0]
        spine = int(val(model.s))
        if p.fabric.switches_in_racks:
            items.append(sum(g.count for g in leaves) + spine)
    racks = installed_racks(p, [(pat, int(val(y))) for pat, y in zip(model.patterns, model.y) if val(y) > 0], items)
    domains = int(val(model.domains)) if p.domains is not None else 0
    return BuildoutPlan(
        servers=servers,
        install_units={t.name: int(val(model.k[t.name])) for t in p.types},
        second_tier=bool(val(model.z)) if p.fabric is not None else False,
        racks=tuple(RackGroup(pat, mult) for pat, mult in racks),
        leaves=tuple(leaves), spine=spine, domains=domains)
