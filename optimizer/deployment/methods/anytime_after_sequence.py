"""Method ``anytime plan after the sequence model``: a sequence objective (latency) on a small
instance, where the exact sequence model found no plan in its share: the anytime search's plan
in its admission orders, without a bound."""
from __future__ import annotations

from typing import Optional

from optimizer.budget import Budget
from optimizer.deployment.anytime_solve import solve_anytime
from optimizer.deployment.context import SolveContext
from optimizer.deployment.methods.rules import no_plan_in_time, small_sequence
from optimizer.deployment.outcome import SolveOutcome


class AnytimeAfterSequence:
    name = "anytime plan after the sequence model"
    bound_is_global = True

    def applies(self, ctx: SolveContext) -> bool:
        return no_plan_in_time(ctx) and small_sequence(ctx)

    def budget(self, ctx: SolveContext) -> Budget:
        return ctx.main

    def run(self, ctx: SolveContext, budget: Budget) -> Optional[SolveOutcome]:
        done = solve_anytime(ctx.problem, ctx.perf, ctx.objective, ctx.main_deadline(), ctx.degrees, ctx.layouts,
                             settings=ctx.settings.anytime)
        if done is None or done.value is None:
            return None
        done.notes.append(f"the sequence model found no plan in {ctx.settings.sequence_exact_share:.0%} of the limit; "
                          "plan from the anytime path, without a bound")
        done.method = f"{self.name} ({done.method})"
        return done


METHOD = AnytimeAfterSequence()
