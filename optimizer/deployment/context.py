"""The explicit context of one deployment solve and the protocol of its methods.

A :class:`SolveContext` carries everything a solve method reads: the problem, the one
performance model, the objective, the :class:`~optimizer.budget.Budget` of the whole call and
the main methods' part of it, the :class:`~optimizer.deployment.progress.Progress` sink, the
:class:`~optimizer.deployment.settings.SolverSettings`, and what the methods have found so far
(the incumbent :attr:`SolveContext.outcome`, the comparison rows). The strategy
(:mod:`optimizer.deployment.strategy`) runs the registered methods over it in turn.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from optimizer.budget import Budget
from optimizer.deployment.outcome import SolveOutcome
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.progress import Progress
from optimizer.deployment.schema import Problem
from optimizer.deployment.settings import SolverSettings


@dataclass
class SolveContext:
    """One solve's inputs, limits and findings.

    Attributes:
        problem, perf, objective: what is solved, with which performance model, for what.
        budget: the whole call's budget (main methods, comparison rows, explanations).
        main: the main methods' part of ``budget`` (they stop by its deadline).
        progress: where ``--progress`` rows go.
        settings: shares and tuning constants.
        degrees, layouts: the options the plan may use (None: the problem's).
        anytime: the anytime search may run (the exact formulations alone otherwise).
        compare: run the comparison rows (each option alone) after the main methods.
        solve_restricted: runs the main methods on a copy of this context restricted to some
            degrees or layouts (set by the strategy: the comparison rows use it).
        outcome: the best outcome so far (its plan and bound, with the methods that produced
            them); None before any method returned one.
        rows: the comparison rows (:class:`~optimizer.deployment.explain.Alternative`).
        ran: ``(method name, status, seconds)`` of every method run, in order.
        t0: when the solve started (``time.perf_counter()``).
    """

    problem: Problem
    perf: PerfModel
    objective: Any
    budget: Budget
    main: Budget
    progress: Progress = field(default_factory=Progress.off)
    settings: SolverSettings = field(default_factory=SolverSettings)
    degrees: Optional[tuple] = None
    layouts: Optional[tuple] = None
    anytime: bool = True
    compare: bool = False
    solve_restricted: Optional[Callable[..., SolveOutcome]] = None
    outcome: Optional[SolveOutcome] = None
    rows: list = field(default_factory=list)
    ran: list = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)

    @property
    def has_plan(self) -> bool:
        return self.outcome is not None and self.outcome.evaluation is not None

    def main_deadline(self) -> float:
        """The main methods' deadline (``time.perf_counter()``); without a limit, the default
        time from the start."""
        if self.main.deadline is not None:
            return self.main.deadline
        return self.t0 + self.settings.default_time_limit_s


class SolveMethod(Protocol):
    """One way of producing a plan, a bound, or both.

    Attributes:
        name: how results, ``--progress`` rows and the JSON ``solver.method`` name it.
        bound_is_global: its bound holds over the whole decision space the docs state (not a
            restriction of it), so the strategy may keep it as the solve's bound.
    """

    name: str
    bound_is_global: bool

    def applies(self, ctx: SolveContext) -> bool:
        """Whether the method runs, given the problem and what earlier methods found."""

    def budget(self, ctx: SolveContext) -> Budget:
        """Its share of the time (a budget split off ``ctx.main`` or ``ctx.budget``)."""

    def run(self, ctx: SolveContext, budget: Budget) -> Optional[SolveOutcome]:
        """A plan and/or bound (an outcome naming ``method`` and ``bound_method``), or None."""
