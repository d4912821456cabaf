"""Problem registry: an instance's top-level section picks the problem that solves it.

Each problem package ``optimizer/<name>/`` declares itself in a light module
``optimizer/<name>/spec.py`` (no solver imports) holding ``SPEC = ProblemSpec(...)``; the
registry finds every such module, so a new problem (``serving:``, ``supernode:``) plugs in
by adding its package, without editing this dispatcher. The package itself is imported only
when an instance asks for it.

Every problem follows one pipeline (:class:`Pipeline`), the same five steps in the same order:
``load`` (instance file -> validated data, units converted once), ``build`` (data -> solver
model with named constraint families), ``solve`` (within a :class:`~optimizer.budget.Budget` ->
a frozen solution stating status, objective, bound, gap, time and the methods that produced the
plan and the bound), ``evaluate`` (an independent re-check of a plan), ``explain`` (a frozen
solution -> an explanation: binding constraints, alternatives, conflicts) and ``report`` (the
three -> the report, built once). A package exposes ``PIPELINE`` (an object with those
methods) and :func:`run_pipeline` runs it for the CLI. The report has ``status``
(:class:`~optimizer.result.Status`), ``to_dict()`` (the result envelope), ``render(console)``
(the table output) and optionally ``write(folder) -> list[Path]`` (``--output`` files).
"""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional, Protocol, runtime_checkable

from optimizer.budget import Budget, ProgressSink, no_progress
from optimizer.errors import EXIT_INFEASIBLE, EXIT_NOT_FOUND, EXIT_OK, EXIT_TIME_LIMIT, InputError
from optimizer.result import Status


@dataclass(frozen=True)
class ProblemSpec:
    """One problem's registry entry.

    Attributes:
        section: the instance's top-level key that selects it (e.g. ``buildout``).
        package: the package whose ``PIPELINE`` solves it (e.g. ``optimizer.buildout``).
        summary: one line for help texts.
        objectives: the package of its objectives (``objectives/<problem>/``).
        also_selected_by: other top-level keys that select it when no section key is given
            (the deployment problem predates sections: ``model``/``hardware``/``workload``).
        plots: the module with ``write(report, folder) -> list[Path]`` that draws the
            problem's ``--plot`` figures (e.g. ``optimizer.deployment.plots``; see
            :mod:`optimizer.plots`); empty: the problem has no figures.
    """

    section: str
    package: str
    summary: str
    objectives: str = ""
    also_selected_by: frozenset = field(default_factory=frozenset)
    plots: str = ""

    def module(self):
        return importlib.import_module(self.package)

    def plots_module(self):
        """The imported :attr:`plots` module, or None when the problem declares none."""
        return importlib.import_module(self.plots) if self.plots else None


@lru_cache(maxsize=1)
def registry() -> dict[str, ProblemSpec]:
    """``{section: ProblemSpec}`` of every ``optimizer/<pkg>/spec.py``.

    Raises:
        ValueError: two packages claim the same section.
    """
    import sys

    # the root package's path (not an import of it: its __init__ reaches every problem)
    found: dict[str, ProblemSpec] = {}
    for info in sorted(pkgutil.iter_modules(sys.modules[__name__.rsplit(".", 1)[0]].__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        spec = _load_spec(info)
        if spec is None:
            continue
        if spec.section in found:
            raise ValueError(f"problem section '{spec.section}' is declared by {found[spec.section].package} "
                             f"and {spec.package}")
        found[spec.section] = spec
    return found


def _load_spec(info) -> ProblemSpec | None:
    """``SPEC`` of ``optimizer/<pkg>/spec.py``, read without importing the package itself (its
    ``__init__`` may import the whole solver stack; a run imports only the package it needs)."""
    import sys
    from pathlib import Path

    path = Path(info.module_finder.path) / info.name / "spec.py"
    if not path.is_file():
        return None
    name = f"optimizer._specs.{info.name}"
    if name not in sys.modules:
        loader_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        loader_spec.loader.exec_module(module)
    return sys.modules[name].SPEC


def problem_spec_for(raw: dict[str, Any], path: Path) -> ProblemSpec:
    """The registry entry for this instance.

    Raises:
        InputError: the instance names no known problem section, or several.
    """
    specs = registry()
    present = [s for s in specs if s in raw]
    if len(present) > 1:
        raise InputError(path, ", ".join(present), f"an instance holds one problem: give only one of {', '.join(present)}")
    if present:
        return specs[present[0]]
    # a misspelt section (``servng:``) would otherwise select the problem the other keys imply
    # and be reported as that problem's missing field
    import difflib

    for key in raw:
        if isinstance(key, str) and key not in specs:
            near = difflib.get_close_matches(key, list(specs), n=1, cutoff=0.75)
            if near:
                raise InputError(path, key, f"unknown top-level key (did you mean {near[0]}?)")
    implied = [s for s in specs.values() if s.also_selected_by & raw.keys()]
    if len(implied) == 1:
        return implied[0]
    known = ", ".join(f"{s.section}" + (f" (or {'/'.join(sorted(s.also_selected_by))})" if s.also_selected_by else "")
                      for s in specs.values())
    raise InputError(path, "", f"no problem section: expected one of {known}")


def problem_for(raw: dict[str, Any], path: Path):
    """The problem package for this instance (see :func:`problem_spec_for`)."""
    return problem_spec_for(raw, path).module()


def exit_code_for(status: Status) -> int:
    return {
        Status.OPTIMAL: EXIT_OK,
        Status.FEASIBLE: EXIT_OK,
        Status.INFEASIBLE: EXIT_INFEASIBLE,
        Status.TIME_LIMIT: EXIT_TIME_LIMIT,
        Status.NOT_FOUND: EXIT_NOT_FOUND,
    }[status]


@runtime_checkable
class Pipeline(Protocol):
    """The one protocol of the five problems (see the module docstring). A pipeline may also offer
    ``robust_twin(raw, report, path) -> (raw of the twin, {"tightened", "band"})``: the instance
    whose plan still meets its targets at the pessimistic end of the step-time source's measured
    error band (``--robust``; deployment and serving)."""

    def load(self, raw: dict[str, Any], path: Path, objective: Optional[str] = None) -> Any:
        """Validated problem data; raises InputError naming file, field and problem."""

    def build(self, data: Any) -> Any:
        """The solver model (named constraint families) for ``data``."""

    def solve(self, data: Any, budget: Budget, progress: ProgressSink = no_progress) -> Any:
        """A frozen solution; never mutated afterwards."""

    def evaluate(self, data: Any, plan: Any) -> Any:
        """The independent evaluation of ``plan`` (violations, objective value)."""

    def explain(self, data: Any, solution: Any, budget: Budget) -> Any:
        """The explanation of a frozen solution (binding constraints, alternatives, conflicts)."""

    def report(self, data: Any, solution: Any, explanation: Any) -> Any:
        """The report: ``status``, ``to_dict()``, ``render(console)``."""


def run_pipeline(pipeline: Pipeline, raw: dict[str, Any], path: Path, objective: Optional[str], budget: Budget,
                 output_dir: Optional[Path] = None, progress: Optional[ProgressSink] = None):
    """load -> solve -> explain -> report, within ``budget``; ``output_dir`` gets the report's
    own files (``report.write(folder)``, listed in ``report.outputs``)."""
    data = pipeline.load(raw, path, objective)
    solution = pipeline.solve(data, budget, progress or no_progress)
    explanation = pipeline.explain(data, solution, budget)
    report = pipeline.report(data, solution, explanation)
    if output_dir is not None and hasattr(report, "write"):
        report.outputs = list(report.write(Path(output_dir)))
    return report


def run_problem(spec: ProblemSpec, raw: dict[str, Any], path: Path, objective: Optional[str], budget: Budget,
                output_dir: Optional[Path] = None, progress: Optional[ProgressSink] = None):
    """Run an instance's problem: its package's ``PIPELINE`` through :func:`run_pipeline`."""
    return run_pipeline(spec.module().PIPELINE, raw, path, objective, budget, output_dir, progress)

