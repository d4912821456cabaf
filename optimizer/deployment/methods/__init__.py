"""The deployment solve methods, in the order the strategy tries them.

Each method is one module of this package holding one class and ``METHOD``, an instance of it
(``name``, ``bound_is_global``, ``applies(ctx)``, ``budget(ctx)``, ``run(ctx, budget)``; see
:class:`~optimizer.deployment.context.SolveMethod`). Adding a method is one new module plus its
line below. A method sees what the earlier ones found (``ctx.outcome``) and decides in
``applies`` whether it still has work.
"""
from __future__ import annotations

import importlib

# the main methods, in order: they produce the plan and the bound
MAIN = (
    "anytime_search",
    "faults_lp_verdict",
    "exact_formulations",
    "nominal_under_faults",
    "anytime_after_sequence",
)
# after them, with the explanation's time
AFTER = (
    "comparison_rows",
)


def load(names: tuple[str, ...]) -> tuple:
    """The ``METHOD`` objects of the modules ``names`` of this package, in order."""
    return tuple(importlib.import_module(f"{__name__}.{n}").METHOD for n in names)
