"""Hot-expert placement balancing from routing traces (``experts:`` instances).

:data:`PIPELINE` (the :class:`optimizer.problems.Pipeline` protocol): :mod:`.problem` (load the
instance, its trace and previous placement; solve every layer; score and explain the plans)
-> :mod:`.model` (the CP-SAT model of a layer, families in ``constraints/experts/``, objectives
in ``objectives/experts/``) -> :mod:`.solve` (exact or LNS per layer) -> :mod:`.report`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


class ExpertsPipeline:
    """The expert-placement problem on the one pipeline of :mod:`optimizer.problems`."""

    def load(self, raw: dict[str, Any], path: Path, objective: str | None = None):
        """The validated instance with its trace (:class:`~optimizer.experts.problem.ExpertsData`).

        Raises:
            InputError: bad instance, trace or previous placement; unknown objective.
        """
        from optimizer.experts.problem import load

        return load(raw, Path(path), objective)

    def build(self, data):
        """The CP-SAT model of the first layer over all its GPUs, every replica count allowed
        (the model each exact layer solve starts from; large layers are solved by sub-problems)."""
        import numpy as np

        from optimizer.experts.model import Item, SubProblem, build, choose_scale

        w = np.asarray(data.fit[0], dtype=np.int64)
        E, G, R = len(w), data.num_gpus, data.num_replicas
        kmax = min(G, R - E + 1)
        scale, _exact = choose_scale(float(w.sum()), kmax, data.split, G)
        items = [Item(e=e, options=[(k, int(round(w[e] * scale / k))) for k in range(1, kmax + 1)],
                      amount=int(round(w[e] * scale)), min_inside=1, max_inside=G) for e in range(E)]
        sp = SubProblem(layer=0, gpus=list(range(G)), slots=list(data.slots), node_of=data.node_of, items=items,
                        split=data.split, objective=data.objective)
        return build(sp, hint=False)[0]

    def solve(self, data, budget, progress=None):
        """Every layer's optimised plan, bound and status (:func:`optimizer.experts.problem.solve`)."""
        from optimizer.budget import no_progress
        from optimizer.experts.problem import solve

        return solve(data, budget, progress or no_progress)

    def evaluate(self, data, plan):
        """The independent per-layer scores of ``plan`` (:func:`optimizer.experts.problem.evaluate`)."""
        from optimizer.experts.problem import evaluate

        return evaluate(data, plan)

    def explain(self, data, solution, budget):
        """The plans compared with the trivial and greedy ones (:func:`optimizer.experts.problem.explain`)."""
        from optimizer.experts.problem import explain

        return explain(data, solution, budget)

    def report(self, data, solution, explanation):
        from optimizer.experts.report import ExpertsReport

        return ExpertsReport(data, solution, explanation)


PIPELINE = ExpertsPipeline()
