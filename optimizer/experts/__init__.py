"""Hot-expert placement balancing from routing traces (``experts:`` instances).

``run`` is the entry point used by the ``optimize`` CLI (see optimizer/problems.py).
"""
from __future__ import annotations

from pathlib import Path


def run(raw: dict, path: Path, objective: str | None, budget, output_dir: Path | None, progress=None):
    """Solve an experts instance; returns an :class:`~optimizer.experts.report.ExpertsReport`.

    Raises:
        InputError: bad instance, trace or previous placement; unknown objective.
    """
    from optimizer.experts.problem import run_problem

    return run_problem(raw, Path(path), objective, budget.limit_s, output_dir, deadline=budget.deadline)
