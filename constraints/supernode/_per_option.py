"""Shared body of the fabric's per-option families (:mod:`.fabric_ports`, :mod:`.connection_state`):
an option whose candidate fabric breaks the family's limit is pinned to no instance."""
from __future__ import annotations

from optimizer.result import ConstraintKey


def pin(model, family: str) -> None:
    """``x_o = 0`` under ``<family>[<option label>]`` for every option that breaks ``family``."""
    for r, x, label in zip(model.results, model.x, model.labels):
        if family in r.violations:
            model.add(ConstraintKey(family, label), x == 0)


def describe(family: str, key: ConstraintKey, p) -> str:
    """The option and its candidate fabric's reason, re-derived from the problem."""
    from optimizer.supernode.perf import evaluate_option, options

    opt = next((o for o in options(p) if o.label(p) == key.element), None)
    violations = evaluate_option(p, opt).violations if opt is not None else {}
    return f"{key.element}: {violations[family]}" if family in violations else str(key)
