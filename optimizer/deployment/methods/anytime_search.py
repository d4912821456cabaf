"""Method ``anytime search``: a plan first, a bound early, exact where it is cheap, then
improvement (:func:`optimizer.deployment.anytime_solve.solve_anytime`). Its plan comes from
list scheduling, packings, the configuration LP's integer master, the instance-mix search, the
exact search on small instances, local moves or LNS (named in brackets); its bound from the fluid
LP relaxation, the configuration LP or the exact search (``bound_method``)."""
from __future__ import annotations

from typing import Optional

from optimizer.budget import Budget
from optimizer.deployment.anytime_solve import solve_anytime
from optimizer.deployment.context import SolveContext
from optimizer.deployment.methods.rules import anytime_applies
from optimizer.deployment.outcome import SolveOutcome
from optimizer.result import Status


class AnytimeSearch:
    name = "anytime search"
    bound_is_global = True

    def applies(self, ctx: SolveContext) -> bool:
        return ctx.outcome is None and ctx.anytime and anytime_applies(ctx)

    def budget(self, ctx: SolveContext) -> Budget:
        return ctx.main

    def run(self, ctx: SolveContext, budget: Budget) -> Optional[SolveOutcome]:
        out = solve_anytime(ctx.problem, ctx.perf, ctx.objective, ctx.main_deadline(), ctx.degrees, ctx.layouts,
                            ctx.progress, ctx.settings.anytime)
        if out is not None and not out.bound_method and out.status == Status.INFEASIBLE:
            # the proof's phase, e.g. "anytime (LP relaxation)" -> "anytime search (LP relaxation)"
            out.bound_method = f"{self.name} ({out.stats.name.removeprefix('anytime (').removesuffix(')')})"
        return out


METHOD = AnytimeSearch()
