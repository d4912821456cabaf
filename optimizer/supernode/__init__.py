"""Supernode sizing (reference chapter, section 6.7.4): how many cards each instance's scale-up
domain spans, where read-only lookup tables (Engram) and the KV live among HBM, host memory, a
memory pool, ROM and SRAM, and what that does to sessions per card, step time, tokens/s per
card and single-user speed.

:data:`PIPELINE` (the :class:`optimizer.problems.Pipeline` protocol): :mod:`.schema` (strict
input, units, the objective object) -> :mod:`.perf` (pure model: every option's best batch and
figures) -> :mod:`.model` (CP-SAT, families in ``constraints/supernode/``) -> :mod:`.solve`
(lexicographic, objectives in ``objectives/supernode/``) -> :mod:`.evaluate` (independent
scalar re-check) -> :mod:`.explain` -> :mod:`.report` (result envelope).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from optimizer.budget import Budget, ProgressSink, no_progress
from optimizer.supernode import explain as _explain
from optimizer.supernode import solve as _solve
from optimizer.supernode.evaluate import Evaluation, evaluate as _evaluate
from optimizer.supernode.explain import SupernodeExplanation
from optimizer.supernode.model import SupernodeModel, build as _build
from optimizer.supernode.perf import evaluate_all
from optimizer.supernode.plan import BuiltOption, SupernodePlan
from optimizer.supernode.report import SupernodeReport
from optimizer.supernode.schema import Problem, load as _load
from optimizer.supernode.solve import SupernodeSolution

__all__ = ["PIPELINE", "SupernodePipeline", "SupernodeReport", "SupernodeSolution", "SupernodeExplanation",
           "SupernodePlan", "BuiltOption", "Problem"]


class SupernodePipeline:
    """The supernode problem on the one pipeline of :mod:`optimizer.problems`.

    Args:
        thresholds: the explanation computes flip thresholds (re-solves; tests that do not
            read them turn them off).
    """

    def __init__(self, thresholds: bool = True):
        self.thresholds = thresholds

    def load(self, raw: dict[str, Any], path: Path, objective: str | None = None) -> Problem:
        """The resolved problem, its objective object included.

        Raises:
            InputError: bad input, including an unknown objective.
        """
        return _load(raw, path, objective)

    def build(self, data: Problem) -> SupernodeModel:
        """The CP-SAT model over every evaluated option (no objective)."""
        return _build(data, evaluate_all(data), with_built_flags=data.objective.needs_built_flags())

    def solve(self, data: Problem, budget: Budget, progress: ProgressSink = no_progress) -> SupernodeSolution:
        """The lexicographic solve within ``budget``; the plan is re-checked independently and
        the objective recomputed from the re-check where the objective defines one.

        Raises:
            RuntimeError: the plan fails the independent check, or its objective disagrees with
                the re-computed one (a modelling bug).
        """
        t0 = time.perf_counter()
        solution = _solve.solve(data, budget)
        if solution.plan is None:
            return dataclasses.replace(solution, wall_s=time.perf_counter() - t0)
        ev = self.evaluate(data, solution.plan)
        if ev.violations:
            raise RuntimeError(f"supernode plan fails the independent check: {ev.violations}")
        recheck = data.objective.evaluated(ev)
        if recheck is not None and abs(recheck - solution.value) > 1e-3 * max(1.0, solution.value):
            raise RuntimeError(f"{data.objective.name} {solution.value} disagrees with the re-check {recheck}")
        return dataclasses.replace(solution, evaluation=ev, wall_s=time.perf_counter() - t0)

    def evaluate(self, data: Problem, plan: SupernodePlan) -> Evaluation:
        """The independent re-check of ``plan`` (:func:`optimizer.supernode.evaluate.evaluate`)."""
        return _evaluate(data, plan)

    def explain(self, data: Problem, solution: SupernodeSolution, budget: Budget) -> SupernodeExplanation:
        """Binding limits, alternatives and flip thresholds (re-solves within ``budget``), or the conflict."""
        t0 = time.perf_counter()
        out = _explain.explain(data, solution, budget, thresholds=self.thresholds)
        return dataclasses.replace(out, wall_s=time.perf_counter() - t0)

    def report(self, data: Problem, solution: SupernodeSolution, explanation: SupernodeExplanation) -> SupernodeReport:
        return SupernodeReport(data, solution, explanation)


PIPELINE = SupernodePipeline()
