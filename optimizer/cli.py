"""``optimize INSTANCE.yaml``: one command for the three problems.

The instance's top-level section picks the problem: ``experts:`` (hot-expert placement),
``buildout:`` (rack build-out sizing), otherwise a deployment (``model``/``hardware``/
``workload``). Exit codes are listed in :mod:`optimizer.errors`.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import click

from optimizer.errors import EXIT_BAD_INPUT, InputError
from optimizer.problems import exit_code_for, problem_spec_for
from optimizer.schema_base import apply_overrides, read_yaml


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("instance", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--objective", default=None,
              help="deployment: cost|makespan|latency|energy (default cost); experts: max-load|inter-node|migration "
                   "(default max-load); buildout: gpus|cost|racks (default gpus).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Terminal tables or one JSON object on stdout.")
@click.option("--time-limit", "time_limit", type=float, default=None,
              help="Wall-clock limit, seconds (default: the problem's own); for a deployment it bounds the whole "
                   "command, explanations included (ends within the limit + 10 %).")
@click.option("--set", "overrides", multiple=True, metavar="dotted.key=value",
              help="Override any instance field for a what-if run, e.g. --set hardware.servers=2.")
@click.option("--output", "output_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for output files: result.json (every problem), placement.json and "
                   "sglang_expert_location.json (experts); every file written is listed on stderr (table) "
                   "or under 'files' (json).")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for PNG figures: timeline.png and memory.png (deployment), expert_load.png "
                   "(experts), racks.png (buildout), supernode_options.png (supernode). The files written are "
                   "listed on stderr (table) or under 'files' (json).")
@click.option("--progress", is_flag=True, default=False,
              help="Deployment: show the incumbent, the proven bound and the gap as the solve goes on (stderr).")
def main(instance: Path, objective: str | None, fmt: str, time_limit: float | None,
         overrides: tuple[str, ...], output_dir: Path | None, plot_dir: Path | None, progress: bool = False) -> None:
    """Solve INSTANCE.yaml to a proven optimum and explain the result."""
    from optimizer.deployment import api as deployment_api

    deployment_api.COMMAND_START = time.perf_counter()  # --time-limit counts from here
    live = _progress_display() if progress else None
    try:
        if time_limit is not None and not (math.isfinite(time_limit) and time_limit > 0):
            raise InputError("--time-limit", "", f"must be a positive number of seconds (got {time_limit})")
        raw = read_yaml(instance)
        raw = apply_overrides(raw, list(overrides), instance)
        spec = problem_spec_for(raw, instance)
        report = spec.module().run(raw, instance, objective, time_limit, output_dir)
        files: list[str] = []
        if plot_dir is not None:
            from optimizer.plots import write_plots

            plots = write_plots(report, plot_dir, spec)
            files = [str(f) for f in plots.files]
            for line in plots.messages:
                click.echo(line, err=True)
        if output_dir is not None:
            files += [str(f) for f in getattr(report, "outputs", None) or []]
            files.append(str(output_dir / "result.json"))
            _write_result(report, output_dir, files)
    except InputError as exc:
        click.echo(exc.line(), err=True)
        sys.exit(EXIT_BAD_INPUT)
    except OSError as exc:  # an output or plot folder that cannot be written
        where = exc.filename or output_dir or plot_dir
        click.echo(f"error: {where}: cannot write: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    finally:
        deployment_api.COMMAND_START = None
        if live is not None:
            live()
    if fmt == "json":
        click.echo(json.dumps(_result_dict(report, files), indent=2, default=_json_default))
    else:
        for f in files:
            click.echo(f"wrote {f}", err=True)
        from rich.console import Console

        # a pipe or file gets a fixed, wide layout; a terminal its own width
        report.render(Console() if sys.stdout.isatty() else Console(width=120))
    sys.exit(exit_code_for(report.status))


def _progress_display():
    """``--progress``: a rich table on stderr, one row per improvement of the incumbent or the
    bound (elapsed time, phase, incumbent, bound, gap). Returns the function that closes it."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from optimizer.deployment import anytime

    table = Table(title="deployment solve: incumbent, bound and gap", title_justify="left")
    for col in ("time s", "phase", "incumbent", "bound", "gap"):
        table.add_column(col, justify="right" if col != "phase" else "left")
    live = Live(table, console=Console(stderr=True), refresh_per_second=4, transient=False)
    live.start()

    def show(d: dict) -> None:
        fmt = lambda v: "-" if v is None else f"{v:.6g}"
        table.add_row(f"{d['elapsed_s']:.2f}", d["phase"], fmt(d["value"]), fmt(d["bound"]),
                      "-" if d["gap"] is None else f"{d['gap'] * 100:.2f}%")
        live.refresh()

    anytime.set_progress(show)

    def close() -> None:
        anytime.set_progress(None)
        live.stop()

    return close


def _result_dict(report, files: list[str]) -> dict:
    """The ``--format json`` object; ``files`` lists every file written (``--plot`` figures,
    ``--output`` files, ``result.json``), when any."""
    d = report.to_dict()
    if files:
        d["files"] = list(d.get("files", [])) + files
    return d


def _write_result(report, output_dir: Path, files: list[str]) -> None:
    """``--output DIR``: every problem writes ``DIR/result.json`` (the ``--format json`` object);
    expert placement also writes its placement files there."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "result.json").write_text(json.dumps(_result_dict(report, files), indent=2, default=_json_default))


def run() -> None:
    """Console entry point: like :func:`main`, but a command-line usage error is one line
    (exit code 2) rather than click's usage block."""
    try:
        code = main(standalone_mode=False)  # returns only for --help (main itself exits)
    except click.UsageError as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except click.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _json_default(obj):
    import numpy as np

    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


if __name__ == "__main__":  # pragma: no cover
    run()
