"""Supernode families checked per option (an option: size S, fabric, a tier per table, the KV tier).

Each is a property of the option alone, computed by :func:`optimizer.supernode.perf.evaluate_option`;
an option that breaks one cannot be built (``x_o = 0`` under the family's key):

* ``memory``: HBM per card holds the weights (eq 6-14), the reserve U and at least one
  session's KV when KV is in HBM: ``W_card + U + K <= C`` (eq 6-1);
* ``tier_capacity``: host memory per server, ROM and SRAM per card hold the tables (and KV) placed there;
* ``pool_capacity``: one instance's tables (and KV) fit the memory pool;
* ``slo``: one session per card meets the per-token target (step <= ``slo_ms_per_token``).

    x_o = 0      <family>[<option label>], every option o that breaks the family's limit

The fabric's per-option families (``fabric_ports``, ``connection_state``) have their own modules.
The ``pool_capacity`` family also holds the pool's shared capacity (:mod:`.pool`,
``pool_capacity[pool]``); this module's keys are the per-option ones.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "option_limits"  # the module's name in the formulation; its keys use KEY_FAMILIES
KEY_FAMILIES = ("memory", "tier_capacity", "pool_capacity", "slo")
FAMILIES = KEY_FAMILIES


def key(family: str, label: str) -> ConstraintKey:
    return ConstraintKey(family, label)


def define(model, p) -> None:
    """Pin every option that breaks a limit to no instance (``model``: the supernode model with
    its evaluated options ``results``, variables ``x`` and option ``labels``)."""
    for r, x, label in zip(model.results, model.x, model.labels):
        for family in r.violations:
            if family not in KEY_FAMILIES:  # the fabric's per-option families have their own modules
                continue
            model.add(key(family, label), x == 0)


def describe(key_: ConstraintKey, p) -> str:
    """The option and the limit it breaks, re-evaluated from the problem (``str(key_)`` when the
    key names no option that breaks it)."""
    from optimizer.supernode.perf import evaluate_option, options

    opt = next((o for o in options(p) if o.label(p) == key_.element), None)
    violations = evaluate_option(p, opt).violations if opt is not None else {}
    if key_.family not in violations:
        return str(key_)
    return f"{key_.element}: {violations[key_.family]}"
