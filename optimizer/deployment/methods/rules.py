"""When the anytime search and the fallbacks apply (shared by several solve methods)."""
from __future__ import annotations

from dataclasses import replace

from optimizer.deployment.configurations import chain_degrees
from optimizer.deployment.context import SolveContext
from optimizer.deployment.params import usable_degrees


def anytime_applies(ctx: SolveContext, problem=None, any_size: bool = False) -> bool:
    """The anytime search handles problems without faults whose objective needs no sequence
    (or, beyond ``settings.sequence_sessions`` sessions, where the sequence formulation finds
    nothing in time: a plan in the search's admission orders, without a bound; ``any_size``: at
    any size, for the fallbacks), with replicas that pack into servers exactly."""
    problem = ctx.problem if problem is None else problem
    obj = ctx.objective
    if problem.faults or (obj.needs_sequence and len(problem.sessions) <= ctx.settings.sequence_sessions
                          and not any_size):
        return False
    if problem.tp_only:
        allowed = tuple(problem.degrees if ctx.degrees is None else ctx.degrees)
        return chain_degrees(problem, usable_degrees(problem, ctx.perf, allowed))
    return True


def nominal(ctx: SolveContext):
    """The problem without its faults (a fault only delays: its bounds and infeasibility carry over)."""
    return replace(ctx.problem, faults=())


def small_sequence(ctx: SolveContext) -> bool:
    """A sequence objective (latency) on an instance the exact sequence model takes first."""
    return ctx.anytime and ctx.objective.needs_sequence and anytime_applies(ctx, any_size=True)


def fault_fallback(ctx: SolveContext) -> bool:
    """Faults, where the run without faults has an anytime plan to fall back on."""
    return ctx.anytime and bool(ctx.problem.faults) and anytime_applies(ctx, nominal(ctx), any_size=True)


def no_plan_in_time(ctx: SolveContext) -> bool:
    """The methods so far ran out of time without a plan."""
    from optimizer.result import Status

    o = ctx.outcome
    return o is not None and o.value is None and o.status == Status.TIME_LIMIT
