"""Method ``LP verdict without faults``: with faults and many sessions, the fluid LP of the run
without faults decides infeasibility at once (a fault only delays: no plan without faults, none
with them), where the sequence model would spend its share. Smaller instances go to the exact
formulations, which also explain (the most sessions on time)."""
from __future__ import annotations

from typing import Optional

from optimizer.budget import Budget
from optimizer.deployment.anytime_solve import nominal_lp_verdict
from optimizer.deployment.context import SolveContext
from optimizer.deployment.methods.rules import fault_fallback, nominal
from optimizer.deployment.outcome import SolveOutcome


class FaultsLpVerdict:
    name = "LP verdict without faults"
    bound_is_global = True

    def applies(self, ctx: SolveContext) -> bool:
        return ctx.outcome is None and len(ctx.problem.sessions) > ctx.settings.anytime.small_sessions and fault_fallback(ctx)

    def budget(self, ctx: SolveContext) -> Budget:
        return ctx.main

    def run(self, ctx: SolveContext, budget: Budget) -> Optional[SolveOutcome]:
        verdict = nominal_lp_verdict(nominal(ctx), ctx.perf, ctx.objective, ctx.degrees, ctx.layouts)
        if verdict is None:
            return None
        what = "meets the on-time requirement" if "on time" in verdict.notes[-1] else "exists"
        verdict.notes.append(f"no plan {what} even without a fault (the nominal run), so none does with the faults")
        verdict.bound_method = f"{self.name} (fluid LP relaxation, HiGHS)"
        return verdict


METHOD = FaultsLpVerdict()
