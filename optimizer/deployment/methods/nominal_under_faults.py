"""Method ``anytime plan without faults``: with faults, where the exact formulations found no
plan in their share, the anytime search's plan for the run without faults, re-evaluated with
every fault scenario (worst case); kept when the evaluator accepts it and every scenario meets
the on-time requirement. The bound of the run without faults stays a bound: a fault only
delays, so every scenario's objective is at least the nominal one."""
from __future__ import annotations

import math
from typing import Optional

from optimizer.budget import Budget
from optimizer.deployment.anytime_solve import solve_anytime
from optimizer.deployment.context import SolveContext
from optimizer.deployment.evaluate import evaluate
from optimizer.deployment.methods.rules import fault_fallback, no_plan_in_time, nominal
from optimizer.deployment.outcome import SolveOutcome, finish
from optimizer.result import Status


class NominalPlanUnderFaults:
    name = "anytime plan without faults"
    bound_is_global = True

    def applies(self, ctx: SolveContext) -> bool:
        return no_plan_in_time(ctx) and fault_fallback(ctx)

    def budget(self, ctx: SolveContext) -> Budget:
        return ctx.main

    def run(self, ctx: SolveContext, budget: Budget) -> Optional[SolveOutcome]:
        problem, obj = ctx.problem, ctx.objective
        done = solve_anytime(nominal(ctx), ctx.perf, obj, ctx.main_deadline(), ctx.degrees, ctx.layouts,
                             settings=ctx.settings.anytime)
        if done is None or done.evaluation is None:
            return None
        ev = evaluate(problem, done.evaluation.plan, ctx.perf)
        value = obj.value(ev)
        if ev.violations or value is None or not math.isfinite(value):
            return None
        bound = None if done.bound is None else min(done.bound, value)
        out = finish(Status.FEASIBLE, obj, value, bound, ev, done.stats, done.degrees,
                     done.mode + ", faults re-evaluated")
        share = ctx.settings.sequence_exact_share
        out.notes.append(f"{len(problem.sessions)} sessions with faults: the exact formulations found no plan in "
                         f"{share:.0%} of the limit; the plan is the anytime path's for the run without "
                         f"faults, re-evaluated with every fault (worst case), and the bound is the run without faults'")
        out.method = f"{self.name} ({done.method})"
        out.bound_method = f"{done.bound_method}, run without faults" if bound is not None else ""
        return out


METHOD = NominalPlanUnderFaults()
