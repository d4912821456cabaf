"""Method ``exact formulations``: the configuration LP/MILP, ordered columns (faults), the
compact aggregate and sequence CP-SAT models (Dinkelbach for ratio objectives) and the batched
configurations, chosen by :func:`optimizer.deployment.exact.solve_exact`; the formulation that
produced the plan and proved the bound is named in brackets."""
from __future__ import annotations

import time
from typing import Optional

from optimizer.budget import Budget
from optimizer.deployment.context import SolveContext
from optimizer.deployment.exact import solve_exact
from optimizer.deployment.methods.rules import fault_fallback, small_sequence
from optimizer.deployment.outcome import SolveOutcome


class ExactFormulations:
    name = "exact formulations"
    bound_is_global = True

    def applies(self, ctx: SolveContext) -> bool:
        return ctx.outcome is None

    def budget(self, ctx: SolveContext) -> Budget:
        if small_sequence(ctx) or fault_fallback(ctx):  # the rest is for the anytime fallback
            main_s = ctx.main.limit_s if ctx.main.limit_s is not None else ctx.settings.default_time_limit_s
            return ctx.main.within(ctx.settings.sequence_exact_share * main_s)
        return ctx.main

    def run(self, ctx: SolveContext, budget: Budget) -> Optional[SolveOutcome]:
        deadline = budget.deadline if budget.deadline is not None else ctx.main_deadline()
        return solve_exact(ctx.problem, ctx.objective, deadline, ctx.degrees, ctx.perf, ctx.layouts, ctx.progress)


METHOD = ExactFormulations()
