"""Rack build-out sizing under a kW budget (issue 4).

``optimize INSTANCE.yaml`` with a ``buildout:`` section: how many servers of which types fit
a power budget, in how many air- or liquid-cooled racks, with how many leaf and spine switch
chips, installed in whole units; which limit binds and what the next unit would need.

:data:`PIPELINE` (the :class:`optimizer.problems.Pipeline` protocol): :mod:`.schema` (strict
input, unit conversion, the objective object) -> :mod:`.model` (CP-SAT model, constraint
families in ``constraints/buildout/*.py``) -> :mod:`.solve` (lexicographic objectives from
``objectives/buildout/*.py``) -> :mod:`.evaluate` (independent check) -> :mod:`.explain`
(binding limits by what-if solves) -> :mod:`.report`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from optimizer.budget import Budget, ProgressSink, no_progress
from optimizer.buildout import explain as _explain
from optimizer.buildout import solve as _solve
from optimizer.buildout.evaluate import Evaluation, evaluate as _evaluate
from optimizer.buildout.explain import BuildoutExplanation
from optimizer.buildout.model import BuildoutModel, build as _build
from optimizer.buildout.plan import BuildoutPlan
from optimizer.buildout.report import BuildoutReport
from optimizer.buildout.schema import Problem, load as _load
from optimizer.buildout.solve import BuildoutSolution

__all__ = ["PIPELINE", "BuildoutPipeline", "BuildoutReport", "BuildoutSolution", "BuildoutExplanation",
           "BuildoutPlan", "Problem"]


class BuildoutPipeline:
    """The build-out problem on the one pipeline of :mod:`optimizer.problems`."""

    def load(self, raw: dict[str, Any], path: Path, objective: str | None = None) -> Problem:
        """The resolved problem, its objective object included.

        Raises:
            InputError: bad input, including an unknown objective.
        """
        return _load(raw, path, objective)

    def build(self, data: Problem) -> BuildoutModel:
        """The CP-SAT model with every constraint family (no objective)."""
        return _build(data)

    def solve(self, data: Problem, budget: Budget, progress: ProgressSink = no_progress) -> BuildoutSolution:
        """The lexicographic solve within ``SOLVE_SHARE`` of ``budget`` (at least ``MIN_SOLVE_S``),
        the rest left to the explanation; the plan is checked by the independent evaluator.

        Raises:
            RuntimeError: the solver's plan fails the independent evaluation (a modelling bug).
        """
        stage_budget = budget.split(_solve.SOLVE_SHARE, at_least_s=_solve.MIN_SOLVE_S) if budget.limited else budget
        solution = _solve.solve(data, stage_budget)
        if solution.plan is None:
            return solution
        ev = self.evaluate(data, solution.plan)
        if ev.violations:
            raise RuntimeError(f"build-out plan fails the independent check: {ev.violations}")
        return dataclasses.replace(solution, evaluation=ev)

    def evaluate(self, data: Problem, plan: BuildoutPlan) -> Evaluation:
        """The independent evaluation of ``plan`` (:func:`optimizer.buildout.evaluate.evaluate`)."""
        return _evaluate(data, plan)

    def explain(self, data: Problem, solution: BuildoutSolution, budget: Budget) -> BuildoutExplanation:
        """Binding limits (or the conflict) by what-if solves ending by ``budget``'s deadline."""
        return _explain.explain(data, solution, budget)

    def report(self, data: Problem, solution: BuildoutSolution, explanation: BuildoutExplanation) -> BuildoutReport:
        """The report: the JSON envelope's time is the solve's and the explanation's wall time."""
        return BuildoutReport(data, solution, explanation)


PIPELINE = BuildoutPipeline()
