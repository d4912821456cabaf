"""The supernode CP-SAT model: one integer per option, the named constraint families.

Variables: ``x_o`` instances built as option o (size S_o, fabric, a tier per table, KV tier),
``0 <= x_o <= cards`` (the cards family, not the domain, limits it, so conflicts name it); for the single-user objective also ``y_o`` (option o is built)
and ``t`` (ns). Per-option figures (sessions per card N_o, tokens/s, batch-1 token time,
pool bytes) are precomputed by :mod:`optimizer.supernode.perf`; families live in
``constraints/supernode/`` and add constraints under :class:`~optimizer.result.ConstraintKey`
names, objectives in ``objectives/supernode/``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from constraints.supernode import cards as sn_cards
from constraints.supernode import deploy as sn_deploy
from constraints.supernode import option_limits as sn_option_limits
from constraints.supernode import pool as sn_pool
from constraints.supernode import target as sn_target
from optimizer.cpsat import NamedModel
from optimizer.supernode.perf import OptionResult
from optimizer.supernode.schema import Problem

FAMILIES = [sn_cards, sn_deploy, sn_option_limits, sn_pool, sn_target]


@dataclass
class Ctx:
    """What constraint and objective modules see: the problem, the evaluated options, variables."""

    problem: Problem
    results: list[OptionResult]
    labels: list[str]
    x: list[Any]
    y: list[Any] = field(default_factory=list)

    @property
    def cards_used(self):
        return sum(r.option.size * x for r, x in zip(self.results, self.x))

    @property
    def sessions(self):
        return sum(r.sessions_instance * x for r, x in zip(self.results, self.x))


def build(p: Problem, results: list[OptionResult], explain: bool = False,
          with_single_user: bool = False) -> tuple[NamedModel, Ctx]:
    """Build the model (no objective). ``explain`` guards every key with an assumption literal."""
    nm = NamedModel(explain=explain)
    m = nm.model
    labels = [r.option.label(p) for r in results]
    x = [m.new_int_var(0, p.cards, f"x[{lab}]") for r, lab in zip(results, labels)]
    y = [m.new_bool_var(f"y[{lab}]") for lab in labels] if with_single_user else []
    ctx = Ctx(p, results, labels, x, y)
    for fam in FAMILIES:
        fam.add(nm, ctx)
    return nm, ctx
