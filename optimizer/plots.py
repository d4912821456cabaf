"""PNG figures of a result: ``optimize INSTANCE.yaml --plot DIR``.

One entry point, :func:`write_plots`, dispatches through the problem registry
(:mod:`optimizer.problems`): a problem's ``ProblemSpec.plots`` names a module with

    ``write(report, folder: Path) -> list[Path]``

that writes the problem's figures into ``folder`` (already created) and returns them in order,
or raises :class:`NoPlot` with a reason when the result has nothing to draw (infeasible, time
limit without a plan). A new problem adds its figures by adding that module and naming it in
its ``spec.py``; nothing here changes. A problem whose spec names no module gets one line
``no plots for <section>`` and its exit code is unchanged.

The modules shipped: ``optimizer.deployment.plots`` (timeline.png, memory.png),
``optimizer.experts.plots`` (expert_load.png), ``optimizer.buildout.plots`` (racks.png),
``optimizer.supernode.plots`` (supernode_options.png).

This module keeps what they share: the figure factory and PNG writer (matplotlib's object
API with the Agg canvas: no display, no global pyplot state) and the colours of memory stacks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DPI = 110
ON_TIME = "#4c9f70"
LATE = "#d1495b"
WEIGHTS, KV, RESERVE = "#386fa4", "#f4a259", "#9e9e9e"
CHOSEN = "#d1495b"


class NoPlot(Exception):
    """Raised by a problem's ``write`` when its result has nothing to draw; the message is the
    reason, e.g. ``experts: no placement (infeasible), no load plot``."""


@dataclass
class PlotResult:
    """What :func:`write_plots` did: files written (in order) and one stderr line per figure
    set not written (``messages``)."""

    files: list[Path] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


def write_plots(report: Any, folder: Path, spec) -> PlotResult:
    """Write the figures of ``report`` into ``folder`` through ``spec.plots``.

    Args:
        report: what the problem's ``run(...)`` returned.
        folder: output folder (created when missing, only when the problem has plots).
        spec: the problem's :class:`~optimizer.problems.ProblemSpec`.
    Returns:
        PlotResult; a problem without a plots module writes nothing, with the message
        ``no plots for <section>``; a result without a plan writes nothing, with
        ``no plot: <reason>``.
    Raises:
        OSError: the folder cannot be created or written.
        ImportError, AttributeError: ``spec.plots`` names a module that does not exist or has
            no ``write`` (a packaging bug, caught by tests/test_plots.py).
    """
    out = PlotResult()
    module = spec.plots_module()
    if module is None:
        out.messages.append(f"no plots for {spec.section}")
        return out
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        out.files.extend(module.write(report, folder))
    except NoPlot as why:
        out.messages.append(f"no plot: {why}")
    return out


def figure(w: float, h: float):
    """A constrained-layout matplotlib Figure of ``w`` x ``h`` inches at :data:`DPI`."""
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=DPI, layout="constrained")


def save(fig, path: Path) -> Path:
    """Render ``fig`` with the Agg canvas to the PNG ``path``; returns ``path``.

    Raises:
        OSError: the file cannot be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, format="png")
    return path


def one_figure(data, draw, path: Path, no_plan: str) -> list[Path]:
    """``[path]`` with ``draw(data)`` saved there; raises :class:`NoPlot` with ``no_plan`` when
    ``data`` is None (the report has no plan)."""
    if data is None:
        raise NoPlot(no_plan)
    return [save(draw(data), path)]
