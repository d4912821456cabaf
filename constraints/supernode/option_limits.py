"""Supernode families checked per option (an option: size S, fabric, a tier per table, the KV tier).

Each is a property of the option alone, computed by :func:`optimizer.supernode.perf.evaluate_option`;
an option that breaks one cannot be built (``x_o = 0`` under the family's key):

* ``memory``: HBM per card holds the weights (eq 6-14), the reserve U and at least one
  session's KV when KV is in HBM: ``W_card + U + K <= C`` (eq 6-1);
* ``tier_capacity``: host memory per server, ROM and SRAM per card hold the tables (and KV) placed there;
* ``pool_capacity``: one instance's tables (and KV) fit the memory pool;
* ``slo``: one session per card meets the per-token target (step <= ``slo_ms_per_token``).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILIES = ("memory", "tier_capacity", "pool_capacity", "slo")


def key(family: str, label: str) -> ConstraintKey:
    return ConstraintKey(family, label)


def add(nm, ctx) -> None:
    for r, x, label in zip(ctx.results, ctx.x, ctx.labels):
        for family in r.violations:
            nm.add(key(family, label), x == 0)


def describe(key_: ConstraintKey, p, results_by_label) -> str:
    r = results_by_label.get(key_.element)
    if r is None or key_.family not in r.violations:
        return str(key_)
    return f"{key_.element}: {r.violations[key_.family]}"
