"""The supernode CP-SAT model: one integer per option, the named constraint families.

Variables: ``x_o`` instances built as option o (size S_o, fabric, a tier per table, KV tier),
``0 <= x_o <= cards`` (the cards family, not the domain, limits it, so conflicts name it); for the single-user objective also ``y_o`` (option o is built)
and ``t`` (ns); with a ``supernode.fabric`` section ``f_c``, one Boolean per candidate fabric
(:mod:`constraints.supernode.fabric_choice`: exactly one chosen). Per-option figures (sessions per card N_o, tokens/s, batch-1 token time,
pool bytes) are precomputed by :mod:`optimizer.supernode.perf`; families live in
``constraints/supernode/``: each ``define(model, problem)`` adds its constraints under
:class:`~optimizer.result.ConstraintKey` names and ``describe(key, problem)`` explains one in a
line. :data:`FAMILIES` is the formulation; objectives live in ``objectives/supernode/``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from constraints.supernode import cards as sn_cards
from constraints.supernode import connection_state as sn_connection_state
from constraints.supernode import fabric_budget as sn_fabric_budget
from constraints.supernode import fabric_choice as sn_fabric_choice
from constraints.supernode import fabric_ports as sn_fabric_ports
from constraints.supernode import deploy as sn_deploy
from constraints.supernode import option_limits as sn_option_limits
from constraints.supernode import pool as sn_pool
from constraints.supernode import target as sn_target
from optimizer.cpsat import NamedModel
from optimizer.supernode.perf import OptionResult
from optimizer.supernode.schema import Problem

# the formulation: every constraint family, in the order it is added
FAMILIES = (sn_cards, sn_deploy, sn_option_limits, sn_pool, sn_target, sn_fabric_ports, sn_connection_state,
            sn_fabric_choice, sn_fabric_budget)


def family_module(family: str):
    """The constraints module that owns a key's family.

    Raises:
        KeyError: no module of :data:`FAMILIES` owns it.
    """
    for mod in FAMILIES:
        if family in mod.KEY_FAMILIES:
            return mod
    raise KeyError(family)


@dataclass
class SupernodeModel:
    """The supernode CP-SAT model: the named model, the problem, the evaluated options and the
    variables; what constraint families (``define``) and objectives (``expr``) work on."""

    named: NamedModel
    problem: Problem
    results: list[OptionResult]
    labels: list[str]
    x: list[Any]
    y: list[Any] = field(default_factory=list)
    f: list[Any] = field(default_factory=list)  # one Boolean per candidate fabric (fabric_choice)

    @property
    def cp(self):
        """The OR-Tools model."""
        return self.named.model

    def add(self, key, constraint):
        """Add ``constraint`` under ``key`` (see :meth:`optimizer.cpsat.NamedModel.add`)."""
        return self.named.add(key, constraint)

    @property
    def cards_used(self):
        return sum(r.option.size * x for r, x in zip(self.results, self.x))

    @property
    def fabric_cost(self):
        """USD of the fabrics of all built instances (``sum_o x_o round(cost_o)``; 0 without fabric)."""
        return sum(int(round(r.fabric.cost_usd)) * x for r, x in zip(self.results, self.x) if r.fabric is not None)

    @property
    def sessions(self):
        return sum(r.sessions_instance * x for r, x in zip(self.results, self.x))


def build(p: Problem, results: list[OptionResult], explain: bool = False,
          with_built_flags: bool = False) -> SupernodeModel:
    """Build the model (no objective) over the evaluated options ``results``.

    Args:
        explain: guard every key with an assumption literal (conflict search).
        with_built_flags: add the Booleans ``y_o`` (option o is built) an objective may need.
    """
    nm = NamedModel(explain=explain)
    m = nm.model
    labels = [r.option.label(p) for r in results]
    x = [m.new_int_var(0, p.cards, f"x[{lab}]") for r, lab in zip(results, labels)]
    y = [m.new_bool_var(f"y[{lab}]") for lab in labels] if with_built_flags else []
    model = SupernodeModel(nm, p, results, labels, x, y)
    for family in FAMILIES:
        family.define(model, p)
    return model
