"""``optimize INSTANCE.yaml``: one command for every problem, plus ``optimize calibrate`` and
``optimize sweep``.

The instance's top-level section picks the problem: ``experts:`` (hot-expert placement),
``buildout:`` (rack build-out sizing), ``serving:``, otherwise a deployment (``model``/``hardware``/
``workload``). ``optimize calibrate MEASUREMENTS.csv`` fits efficiency factors to published
throughput (:mod:`optimizer.calibrate`); ``optimize sweep GRID.yaml`` solves a grid of serving
instances (:mod:`optimizer.sweep`). Exit codes are listed in :mod:`optimizer.errors`.
"""
from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path

import click

from optimizer.errors import EXIT_BAD_INPUT, InputError, take_warnings
from optimizer.problems import exit_code_for, problem_spec_for, run_problem
from optimizer.schema_base import apply_overrides, read_yaml


def _objective_help() -> str:
    """The --objective help, listed from the problem registry and each problem's objectives."""
    from objectives.base import default_of, discover
    from optimizer.problems import registry

    parts = []
    for spec in registry().values():
        if not spec.objectives:
            continue
        try:
            objs = discover(spec.objectives)
        except ImportError:
            continue
        parts.append(f"{spec.section}: {'|'.join(objs)} (default {default_of(objs)})")
    return "; ".join(parts) + "."


class _Solve(click.Command):
    """The instance solve, run as ``optimize INSTANCE.yaml``: its usage line says so (not ``optimize
    solve``) and names the subcommands."""

    def format_usage(self, ctx, formatter):
        formatter.write("Usage: optimize [OPTIONS] INSTANCE.yaml\n"
                        "       optimize estimate|fidelity|calibrate|sweep ... (each with --help)\n")


@click.command(cls=_Solve, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("instance", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--objective", default=None, help=_objective_help())
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Terminal tables or one JSON object on stdout.")
@click.option("--time-limit", "time_limit", type=float, default=None,
              help="Wall-clock limit of the whole run (solve and explanations), seconds (default: the "
                   "problem's own); a deployment ends within the limit + 10 %.")
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
@click.option("--pareto", type=click.Choice(["tpot", "ttft"]), is_flag=False, flag_value="tpot", default=None,
              help="serving: sweep the TPOT target (--pareto or --pareto tpot; --pareto ttft also sweeps TTFT) and "
                   "write OUTPUT/pareto.json and pareto.png: tokens/s/GPU against tokens/s/user, one front per mode. "
                   "Needs --output.")
@click.option("--pareto-points", "pareto_points", type=click.IntRange(2, 200), default=None,
              help="TPOT targets of --pareto (geometric, 1/4 to 4x the instance's target; default 20).")
@click.option("--deploy", "deploy", type=click.Choice(["kubernetes"]), default=None,
              help="serving: also write OUTPUT/deploy/kubernetes-<engine>.yaml (StatefulSets and Services with "
                   "nvidia.com/gpu requests per worker group, the P/D router's Deployment). Needs --output.")
@click.option("--robust", is_flag=True, default=False,
              help="deployment and serving: also solve for the pessimistic end of the step-time source's measured "
                   "error band (serving: targets / (1 + error); deployment: deadlines / (1 + finish-time error)) and "
                   "report that plan beside the nominal one with what it costs.")
@click.option("--progress", is_flag=True, default=False,
              help="Show the incumbent, the proven bound and the gap as the solve goes on, one row per method (stderr; deployment, serving and expert placement).")
def main(instance: Path, objective: str | None, fmt: str, time_limit: float | None,
         overrides: tuple[str, ...], output_dir: Path | None, plot_dir: Path | None,
         pareto: str | None = None, pareto_points: int | None = None, progress: bool = False,
         deploy: str | None = None, robust: bool = False) -> None:
    """Solve INSTANCE.yaml to a proven optimum and explain the result.

    Also: optimize calibrate MEASUREMENTS.csv --model ... (fit efficiency factors to measured
    throughput), optimize sweep GRID.yaml --output DIR (a grid of serving solves); see their --help.
    """
    from optimizer.budget import Budget

    started = Budget.for_command(None).start  # --time-limit counts from the process start
    take_warnings()  # this command's warnings only
    live, live_sink = _progress_display() if progress else (None, None)
    try:
        _check_time_limit(time_limit)
        if pareto_points is not None and pareto is None:
            raise InputError("--pareto-points", str(pareto_points), "applies only with --pareto")
        if objective is not None and not objective.strip():
            raise InputError("--objective", "", "is empty: name an objective (see --help) or leave the option out")
        raw = read_yaml(instance)
        raw = apply_overrides(raw, list(overrides), instance)
        if isinstance(raw, dict) and "grid" in raw and "base" in raw:
            raise InputError(instance, "grid", "this is a sweep grid: run `optimize sweep GRID.yaml --output DIR`")
        spec = problem_spec_for(raw, instance)
        if deploy is not None and output_dir is None:
            raise InputError("--deploy", deploy, "needs --output DIR (the manifests go to DIR/deploy/)")
        if deploy is not None and spec.section != "serving":
            raise InputError("--deploy", deploy, f"applies to the serving problem only (this instance is {spec.section})")
        if pareto is not None:
            if deploy is not None:
                raise InputError("--deploy", deploy, "does not apply with --pareto (a front has no one plan to deploy; "
                                                     "solve the chosen point without --pareto)")
            if plot_dir is not None:
                raise InputError("--plot", str(plot_dir), "does not apply with --pareto (pareto.png goes to --output)")
            _pareto(raw, instance, spec, objective, Budget.for_command(time_limit, started, PARETO_OUTPUT_S), output_dir, pareto,
                    PARETO_POINTS if pareto_points is None else pareto_points, fmt)
        # --plot counts against the limit too: its figures' time is kept out of the work's budget
        reserve = _plot_reserve_s(raw) if plot_dir is not None else 0.0
        if robust and not hasattr(spec.module().PIPELINE, "robust_twin"):
            raise InputError(instance, "--robust", f"applies to deployment and serving instances (this one is "
                                                   f"{spec.section})")
        if robust and pareto is not None:
            raise InputError(instance, "--robust", "does not apply with --pareto")
        # --robust: the nominal solve leaves half of a --time-limit to the robust one
        half = time_limit / 2.0 if robust and time_limit is not None else 0.0
        budget = Budget.for_command(time_limit, started, reserve + half)
        report = run_problem(spec, raw, instance, objective, budget, output_dir, live_sink)
        robust_summary = None
        if robust:
            # the twin's solve sizes its parts from its own limit: what the nominal one left of the work's time
            whole = Budget.for_command(time_limit, started, reserve)
            robust_summary = _robust(spec, raw, report, instance, objective, Budget.unlimited() if not whole.limited
                                     else Budget.seconds(max(0.1, whole.deadline - time.perf_counter())))
        files: list[str] = []
        if deploy == "kubernetes":
            from optimizer.serving.deploy import write_kubernetes

            for tag, placed in report.placements():
                report.outputs += write_kubernetes(report.problem, placed, output_dir, tag)
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
    except (InputError, OSError) as exc:  # OSError: an output or plot folder that cannot be written
        _exit_bad_input(_named_override(exc, instance, overrides), output_dir or plot_dir)
    finally:
        if live is not None:
            live()
    _print_warnings()
    if fmt == "json":
        d = _result_dict(report, files)
        if robust_summary is not None:
            d["robust"] = robust_summary
        click.echo(_result_json(d))
    else:
        for f in files:
            click.echo(f"wrote {f}", err=True)
        from rich.console import Console

        # a pipe or file gets a fixed, wide layout; a terminal its own width
        console = Console() if sys.stdout.isatty() else Console(width=120)
        report.render(console)
        if robust_summary is not None:
            from rich.markup import escape

            r = robust_summary
            cost = (f"{r['value']:g} {r['unit']} against {r['nominal_value']:g} nominal "
                    f"({r['extra']:+g} {r['unit']})" if r["value"] is not None and r["nominal_value"] is not None
                    else f"no plan ({r['status']})")
            console.print(escape(f"robust to the error band ({r['tightened']}): status {r['status']}, {cost}"))
    sys.exit(exit_code_for(report.status))


def _robust(spec, raw, report, instance: Path, objective, budget) -> dict:
    """``--robust``: solve the instance's band-tightened twin (its pipeline's ``robust_twin``:
    :meth:`optimizer.serving.ServingPipeline.robust_twin`,
    :meth:`optimizer.deployment.pipeline.DeploymentPipeline.robust_twin`) and summarise it beside
    the nominal plan: ``{status, value, nominal_value, extra, unit, objective, tightened, band, plan}``."""
    twin, how = spec.module().PIPELINE.robust_twin(raw, report, instance)
    rep = run_problem(spec, twin, instance, objective, budget, None, None)
    d, n = rep.to_dict(), report.to_dict()
    value = (d.get("objective") or {}).get("value") if d.get("plan") is not None else None
    nominal = (n.get("objective") or {}).get("value") if n.get("plan") is not None else None
    return {"status": d.get("status"), "objective": (d.get("objective") or {}).get("name"),
            "unit": (d.get("objective") or {}).get("unit", ""), "value": value, "nominal_value": nominal,
            "extra": None if value is None or nominal is None else value - nominal, **how, "plan": d.get("plan")}


PARETO_OUTPUT_S = 1.0  # --pareto: time kept for writing pareto.png and pareto.json


def _pareto(raw, instance: Path, spec, objective, budget, output_dir, sweep: str, points: int, fmt: str) -> None:
    """``--pareto``: the fronts of a serving instance (:mod:`optimizer.serving.pareto`); exits."""
    if spec.section != "serving":
        raise InputError(instance, spec.section, "--pareto applies to serving instances only")
    if output_dir is None:
        raise InputError("--pareto", "", "needs --output DIR (for pareto.json and pareto.png)")
    from optimizer.serving import load_problem
    from optimizer.serving.pareto import pareto as run_pareto
    from optimizer.serving.pareto import render, write

    p = load_problem(raw, instance, objective)
    if p.concurrency is not None:
        raise InputError(instance, "serving.traffic.concurrency", "--pareto sweeps SLO targets at an open-loop rate "
                                                                  "(rate_rps); closed-loop users are not swept")
    # the budget keeps PARETO_OUTPUT_S for the plot and files
    res = run_pareto(p, sweep, points=points, time_limit_s=20.0 if budget.limit_s is None else budget.limit_s,
                     deadline=budget.deadline)
    files = write(res, output_dir)
    if fmt == "json":
        click.echo(_dumps(res.to_dict() | {"files": [str(f) for f in files]}, indent=2))
    else:
        for f in files:
            click.echo(f"wrote {f}", err=True)
        from rich.console import Console

        render(res, Console() if sys.stdout.isatty() else Console(width=120))
    ok = any(c.front for c in res.curves)
    from optimizer.errors import EXIT_INFEASIBLE, EXIT_TIME_LIMIT

    sys.exit(0 if ok else EXIT_TIME_LIMIT if res.not_solved else EXIT_INFEASIBLE)


def _progress_display():
    """``--progress``: a rich table on stderr, one row per improvement of the incumbent or the
    bound (elapsed time, method, incumbent, bound, gap). Returns (close, sink): the function that
    closes it and the progress sink that adds a row."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    table = Table(title="solve: incumbent, bound and gap", title_justify="left")
    for col in ("time s", "method", "incumbent", "bound", "gap"):
        table.add_column(col, justify="right" if col != "method" else "left")
    live = Live(table, console=Console(stderr=True), refresh_per_second=4, transient=False)
    started = []  # the table appears with its first row (bad input prints none: its error line is the answer)

    def show(d: dict) -> None:
        fmt = lambda v: "-" if v is None else f"{v:.6g}"
        table.add_row(f"{d['elapsed_s']:.2f}", d.get("method") or d.get("phase", ""), fmt(d["value"]), fmt(d["bound"]),
                      "-" if d["gap"] is None else f"{d['gap'] * 100:.2f}%")
        if not started:
            live.start()
            started.append(True)
        live.refresh()

    def close() -> None:
        if started:
            live.stop()
            click.echo("", err=True)  # end the table's last line

    return close, show


def _result_dict(report, files: list[str]) -> dict:
    """The ``--format json`` object; ``files`` lists every file written (``--plot`` figures,
    ``--output`` files, ``result.json``), when any."""
    d = dict(report.to_dict())  # a copy: some reports keep the dict they return
    if files:
        d["files"] = list(dict.fromkeys([*d.get("files", []), *files]))
    return d


def _print_warnings() -> None:
    """The input warnings recorded while reading (one stderr line each, see
    :func:`optimizer.errors.warn_input`)."""
    for line in take_warnings():
        click.echo(line, err=True)


def _check_time_limit(time_limit: float | None) -> None:
    """Raises: InputError naming ``--time-limit`` when it is given and not a positive, finite number."""
    if time_limit is not None and not (math.isfinite(time_limit) and time_limit > 0):
        raise InputError("--time-limit", "", f"must be a positive, finite number of seconds (got {time_limit})")


def _named_override(exc: Exception, instance: Path, overrides) -> Exception:
    """An error in a field a ``--set`` changed names the override, not only the instance file."""
    if not isinstance(exc, InputError) or exc.file != str(instance) or not exc.field or "--set" in exc.problem:
        return exc

    def norm(dotted: str) -> str:  # workers.0.tp (a --set key) and workers[0].tp (an error's field) alike
        return re.sub(r"\[(\d+)\]", r".\1", dotted)

    field = norm(exc.field)
    keyed = [(norm(item.partition("=")[0].strip()), item) for item in overrides]
    # the field itself or a field inside the override (a list the override sets): that override;
    # an override inside the field (serving.traffic.isl for an error on serving.traffic): every
    # such override, the error cannot say which of them
    own = [item for key, item in keyed if key and (field == key or field.startswith(key + "."))]
    inside = [item for key, item in keyed if key and key.startswith(field + ".")]
    named = own[-1:] or inside
    if not named:
        return exc
    return InputError(exc.file, exc.field, f"{exc.problem} (set by {', '.join('--set ' + i for i in named)})")


def _exit_bad_input(exc: Exception, where, what: str = "cannot write: ") -> None:
    """One line on stderr and exit code 2: an :class:`InputError` says file, field and problem;
    an ``OSError`` names the path (``where`` when the error has none) and ``what`` failed.
    Warnings recorded before the error are dropped: the error line is the answer."""
    take_warnings()
    if isinstance(exc, InputError):
        click.echo(exc.line(), err=True)
    else:
        click.echo(f"error: {exc.filename or where}: {what}{exc.strerror or exc}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _write_result(report, output_dir: Path, files: list[str]) -> None:
    """``--output DIR``: every problem writes ``DIR/result.json`` (the ``--format json`` object);
    expert placement also writes its placement files there."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "result.json").write_text(_result_json(_result_dict(report, files)))


PLOT_S, PLOT_S_PER_SESSION = 1.0, 5e-4  # --plot: matplotlib's import and figures (3,000 sessions: 2.5 s)


def _plot_reserve_s(raw) -> float:
    """Seconds kept for ``--plot`` out of ``--time-limit``: a fixed part plus a share per
    deployment session (the timeline draws them)."""
    n = 0
    try:
        n = sum(int(g.get("count", 1)) for g in raw["workload"]["sessions"])
    except (KeyError, TypeError, ValueError, AttributeError):
        pass
    return PLOT_S + PLOT_S_PER_SESSION * min(n, 100_000)


PARETO_POINTS = 20  # --pareto-points default
COMPACT_JSON_CHARS = 1_000_000  # larger results are printed without indentation (3.5x faster to write)


def _result_json(d: dict) -> str:
    """A result as JSON: indented, or compact when it is large (a 500,000-session plan is
    114 MB indented and took 3.5 s to encode; compact, 76 MB in 1.0 s: the C encoder)."""
    text = _dumps(d, default=_json_default)
    return text if len(text) > COMPACT_JSON_CHARS else _dumps(d, indent=2, default=_json_default)


@click.command("calibrate", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("measurements", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model", "models", multiple=True, metavar="MAPPING.yaml|NAME=CONFIG.json",
              help="Throughput CSVs: how the CSV's model names map to config.json files: a mapping YAML (models:, "
                   "hardware:) or NAME=CONFIG.json (repeatable). Not used for serving-run files.")
@click.option("--source", "source", type=click.Choice(["chapter", "analytic", "measured"]), default="measured", show_default=True,
              help="Serving runs: the step-time source the factors go on top of.")
@click.option("--runs", "runs", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Serving runs: a runs YAML (defaults: + runs: [{file, gpu, engine, tp, config, ...}]).")
@click.option("--gpu", default=None, help="Benchmark results: catalog GPU the runs used (h100-sxm).")
@click.option("--engine", type=click.Choice(["vllm", "sglang", "trtllm"]), default=None,
              help="Benchmark results: the serving engine.")
@click.option("--tp", type=click.IntRange(1, 1024), default=None, help="Benchmark results: tensor parallel size.")
@click.option("--dp", type=click.IntRange(1, 1024), default=None, help="Benchmark results: attention data parallel size.")
@click.option("--ep", type=click.IntRange(1, 1024), default=None, help="Benchmark results: expert parallel size.")
@click.option("--config", "config", default=None, help="Benchmark results: the model's config.json.")
@click.option("--hf-id", "hf_id", default=None, help="Benchmark results: the model's HuggingFace id (names it).")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp8", "fp4"]), default=None,
              help="Benchmark results: the weights' dtype (default bf16).")
@click.option("--hold-out", "hold_out", type=click.Choice(["model", "workload", "run"]), default="model",
              show_default=True, help="Serving runs: the unit left out by cross-validation.")
@click.option("--hardware", "hardware", multiple=True, metavar="[NAME=]GPU:SERVER",
              help="The CSV's GPU name to catalog GPU and server (repeatable; without NAME= for every row).")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=0, show_default=True,
              help="Seed of the random fit starts (0 or more).")
@click.option("--starts", type=click.IntRange(1, 100), default=8, show_default=True,
              help="Fit starts (all-ones plus seeded random ones); the lowest cost wins.")
@click.option("--output", "output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the fitted factors: efficiency YAML fragment (throughput CSV) or a calibration file.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def calibrate_cmd(measurements: tuple[Path, ...], models, source: str, runs: Path | None, gpu, engine, tp, dp, ep,
                  config, hf_id, dtype, hold_out: str, hardware, seed: int, starts: int, output: Path | None,
                  fmt: str) -> None:
    """Fit factors to measurements. Static-batch throughput (one CSV, columns: model, gpu, dtype, tp, batch,
    isl, osl, output_tokens_per_s): compute/memory/network efficiencies with leave-one-out error.
    Measured serving runs (silicon_sample.csv, vllm bench serve JSON, SGLang bench_serving JSONL, aiperf /
    genai-perf profile exports; what a result file does not record from --gpu/--engine/--tp/--config or
    --runs): per (GPU, engine) prefill/decode factors and a per-step overhead on top of --source, with a
    prior at 1 chosen by cross-validation (performance.calibration)."""
    from optimizer import calibrate as cal
    from optimizer.serving.benchresults import RunIn

    try:
        run = RunIn(config=config, gpu=gpu, engine=engine, tp=tp, dp=dp, ep=ep, hf_id=hf_id, dtype=dtype)
        if not measurements and runs is None:
            raise InputError("calibrate", "", "give result files (MEASUREMENTS...) or --runs RUNS.yaml")
        serving = runs is not None or len(measurements) != 1 or _is_serving_runs(measurements[0])
    except (InputError, OSError) as exc:
        _exit_bad_input(exc, output)
    if serving:
        _calibrate_runs(list(measurements), runs, run, source, hold_out, output, fmt)
    measurements = measurements[0]
    try:
        if not models:
            raise InputError("--model", "", "required for a throughput CSV (how its model names map to config.json files)")
        rows = cal.read_measurements(measurements)
        mp, hw = cal.read_mapping(list(models), list(hardware))
        cal.prepare(rows, mp, hw, measurements)
        if not any(not r.skipped for r in rows):
            raise InputError(measurements, "", "no row can be predicted: " + rows[0].skipped)
        usable = sum(not r.skipped for r in rows)
        if usable < len(cal.FACTORS):
            from optimizer.errors import warn_input

            warn_input(measurements, "", f"{usable} usable row(s) for {len(cal.FACTORS)} efficiency factors: the fit is "
                                         f"not determined by the data (many factor sets fit as well)")
        res = cal.calibrate(rows, seed, starts)
        if output is not None:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(cal.yaml_fragment(res, measurements.name))
    except (InputError, OSError) as exc:
        _exit_bad_input(exc, output)
    _print_warnings()
    if fmt == "json":
        click.echo(_dumps(res.to_dict() | ({"files": [str(output)]} if output else {}), indent=2))
    else:
        from rich.console import Console

        cal.render(res, Console() if sys.stdout.isatty() else Console(width=160))
        if output is not None:
            click.echo(f"wrote {output}", err=True)
    sys.exit(0)


def _is_serving_runs(path: Path) -> bool:
    """A file of measured serving runs (anything but a throughput CSV; unknown content is refused
    by the serving readers, one line)."""
    from optimizer.serving.benchresults import detect

    try:
        return detect(path) != "throughput"
    except InputError:
        return path.suffix.lower() != ".csv"  # a broken CSV keeps the throughput reader's message


def _calibrate_runs(files: list[Path], runs: Path | None, run, source: str, hold_out: str, output: Path | None,
                    fmt: str) -> None:
    from optimizer.serving import benchresults as br
    from optimizer.serving import calibration as sc
    from optimizer.serving.fidelity import read_rows

    try:
        todo = [(f, run, Path.cwd(), "--config/--gpu/--engine/--tp") for f in files]
        if runs is not None:
            todo += [(f, r, base, str(runs)) for f, r, base in br.read_runs(runs, run)]
        rows = []
        for f, r, base, where in todo:
            fmt_ = br.detect(f)
            if fmt_ == "throughput":
                raise InputError(f, "header", "a throughput CSV (output_tokens_per_s) is calibrated alone, with --model")
            rows += read_rows(f) if fmt_ == "silicon_sample" else br.rows_of(f, fmt_, r, base, where)
        name = files[0] if files else runs
        res = sc.calibrate(rows, source, name, hold_out)
        if output is not None:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(res.yaml_text(", ".join(p.name for p, *_ in todo)))
    except (InputError, OSError) as exc:
        _exit_bad_input(exc, output)
    _print_warnings()
    if fmt == "json":
        click.echo(_dumps(res.to_dict() | ({"files": [str(output)]} if output else {}), indent=2,
                              default=_json_default))
    else:
        from rich.console import Console

        sc.render(res, Console() if sys.stdout.isatty() else Console(width=160))
        if output is not None:
            click.echo(f"wrote {output}", err=True)
    sys.exit(0)


@click.command("sweep", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("grid", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--output", "output_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder for sweep.csv and sweep.json; points already in sweep.csv are skipped (resume).")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Run the points on a Dask cluster (tcp://host:8786); default: a local process pool.")
@click.option("--workers", type=click.IntRange(1, 256), default=None,
              help="Local processes (default: CPU count, at most 4).")
@click.option("--time-limit", "time_limit", type=float, default=None, help="Solver limit per point, seconds.")
@click.option("--no-progress", "no_progress", is_flag=True, help="No progress bar.")
def sweep_cmd(grid: Path, output_dir: Path, scheduler: str | None, workers: int | None, time_limit: float | None,
              no_progress: bool) -> None:
    """Solve every point of GRID.yaml (base: a serving instance; grid: dotted fields -> values)."""
    from optimizer.sweep import load_grid, run_sweep

    try:
        _check_time_limit(time_limit)
        g = load_grid(grid)
        res = run_sweep(g, output_dir, scheduler, workers, time_limit, progress=not no_progress)
    except (InputError, OSError) as exc:
        _exit_bad_input(exc, output_dir, what="")
    counts: dict[str, int] = {}
    for r in res.rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    click.echo(f"{len(res.rows)} points ({res.ran} solved now, {res.skipped} already done): "
               + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), err=True)
    for f in res.files:
        click.echo(f"wrote {f}", err=True)
    sys.exit(0)


@click.command("estimate", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("instance", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--set", "overrides", multiple=True, metavar="dotted.key=value",
              help="Override any instance field, e.g. --set serving.traffic.concurrency=32.")
@click.option("--requests", type=click.IntRange(1, 200_000), default=None,
              help="Requests to simulate (default: 10 per user in closed loop, every one counted; open loop: "
                   "serving.simulation.requests, the first 10% or so a warm-up not counted).")
@click.option("--time-limit", "time_limit", type=float, default=None,
              help="Wall-clock seconds for the simulations; a point cut short gets no figures (exit 4).")
def estimate_cmd(instance: Path, fmt: str, overrides: tuple[str, ...], requests: int | None,
                 time_limit: float | None) -> None:
    """Figures of the fixed plan in INSTANCE.yaml (serving.fixed) without optimising: TTFT / TPOT / ITL /
    end-to-end latency (mean, p50, p90, p99), tokens/s per GPU and per user, request rate, simulated under
    closed-loop (traffic.concurrency) or open-loop (rate_rps) traffic, with the source of the timings."""
    from optimizer.schema_base import read_yaml
    from optimizer.serving import load_problem
    from optimizer.budget import Budget
    from optimizer.errors import EXIT_TIME_LIMIT
    from optimizer.serving.estimate import EstimateCut, estimate, render, warn_ignored

    started = Budget.for_command(None).start  # --time-limit counts from the process start
    cut = None
    try:
        _check_time_limit(time_limit)
        raw = apply_overrides(read_yaml(instance), list(overrides), instance)
        if not isinstance(raw, dict) or "serving" not in raw:
            raise InputError(instance, "serving", "optimize estimate takes a serving instance (a serving: section "
                                                  "with serving.fixed)")
        p = load_problem(raw, instance)
        warn_ignored(raw, instance)
        try:
            res = estimate(p, requests, Budget.for_command(time_limit, started).deadline)  # output's share kept
        except EstimateCut as exc:
            res, cut = exc.done, (f"time limit: the simulation of {exc.point} was stopped after {time_limit:g} s "
                                  f"({exc.message}); no figures for it or the points after it (raise --time-limit "
                                  f"or lower --requests)")
    except (InputError, OSError) as exc:
        _exit_bad_input(_named_override(exc, instance, overrides), instance, what="cannot read: ")
    _print_warnings()
    if fmt == "json":
        from optimizer.result import Status, envelope
        from optimizer.serving.estimate import DEFINITIONS

        status = Status.ESTIMATED if cut is None else Status.TIME_LIMIT
        env = envelope("serving-estimate", p.name, status, None, {"estimates": [e.to_dict() for e in res]},
                       {"name": "closed/open-loop simulation of serving.fixed (no search)", "status": status.value,
                        "time_s": time.perf_counter() - started, "gap": None, "method": "estimate", "bound_method": None,
                        **({"cut_short": [cut]} if cut else {})},
                       definitions=DEFINITIONS)
        click.echo(_dumps(env, indent=2, default=_json_default))
    else:
        from rich.console import Console

        if res:
            render(res, Console() if sys.stdout.isatty() else Console(width=160))
    if cut is not None:
        click.echo(cut, err=True)
        sys.exit(EXIT_TIME_LIMIT)
    sys.exit(0)


@click.command("fidelity", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("measured", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--source", "sources", default="chapter,analytic,measured", show_default=True,
              help="Comma-separated step-time sources to predict with (chapter, analytic, measured).")
@click.option("--limit", type=click.IntRange(1, None), default=None, help="Read only the first N rows.")
@click.option("--mapping", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="For vLLM/SGLang benchmark results (.json/.jsonl): model, gpu, engine, engine_version, tp.")
@click.option("--clients", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Benchmark clients of the CSV's campaigns (default: instances/fidelity/clients.yaml).")
@click.option("--calibration", "calibration", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A calibration file (optimize calibrate --output): predict every row before and after its factors.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write a predicted-vs-measured scatter (fidelity.png) into this folder.")
def fidelity_cmd(measured: Path, sources: str, limit: int | None, mapping: Path | None, clients: Path | None,
                 calibration: Path | None, fmt: str, plot_dir: Path | None) -> None:
    """Predict every row of MEASURED (aiconfigurator's silicon_sample.csv layout) with each source and
    print, per (GPU, engine, model, mode) group, the median and mean absolute error of TTFT and TPOT
    (with --calibration: before and after the file's factors)."""
    from optimizer.serving import fidelity as fd

    t0 = time.perf_counter()
    try:
        src = tuple(dict.fromkeys(x.strip() for x in sources.split(",") if x.strip()))  # each source once
        bad = [x for x in src if x not in ("chapter", "analytic", "measured")]
        if bad or not src:
            raise InputError("--source", "", f"unknown source {', '.join(bad) or '(none)'} (chapter, analytic, measured)")
        if mapping is not None and measured.suffix not in (".json", ".jsonl"):
            raise InputError("--mapping", str(mapping), "applies to vLLM / SGLang benchmark results (.json, .jsonl); "
                                                        "a silicon_sample.csv-layout file names its own runs")
        cal = None if calibration is None else fd.read_calibration_option(calibration)  # a bad file: before any row
        rows = fd.predict(fd.read_any(measured, mapping, limit, clients), src, measured, calibration)
        if not rows:
            raise InputError(measured, "", "no measured rows to predict")
        predicted = any(r.predicted for r in rows)
        files = [str(fd.plot(rows, src, plot_dir))] if plot_dir is not None and predicted else []
        if plot_dir is not None and not predicted:
            click.echo("no plot: no row was predicted (see the reasons below)", err=True)
    except (InputError, OSError) as exc:
        _exit_bad_input(exc, measured, what="cannot read: ")
    grp = fd.groups(rows, src, calibrated=cal is not None)
    plan = {"rows": [r.to_dict(cal is not None) for r in rows], "groups": grp, "overall": fd.overall(rows, src)}
    if cal is not None:
        plan["overall_after"] = fd.overall(rows, src, after=True)
        plan["calibration"] = {"file": str(calibration), "source": cal.base, "models": list(cal.models),
                               "not_applied": {s: f"{cal.file} was fitted on the {cal.base} source"
                                               for s in src if s != cal.base}}
    if fmt == "json":
        from optimizer.result import Status, envelope

        env = envelope("serving-fidelity", measured.name, Status.ESTIMATED, None, plan,
                       {"name": "closed-loop simulation of each measured row (no search)", "status": "estimated",
                        "time_s": time.perf_counter() - t0, "gap": None, "method": "fidelity", "bound_method": None},
                       definitions=fd.DEFINITIONS, files=files)
        click.echo(_dumps(env, indent=2, default=_json_default))
    else:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        con = Console() if sys.stdout.isatty() else Console(width=180)
        t = Table(title=f"Fidelity: |predicted / measured - 1| per group ({measured.name}, {len(rows)} rows)"
                        + (f", before -> after {calibration.name}" if cal is not None else ""))
        what = "med before -> after" if cal is not None else "med|mean"
        for c in ("GPU", "engine", "model", "mode", "rows", *[f"{s} TTFT {what}" for s in src],
                  *[f"{s} TPOT {what}" for s in src]):
            t.add_column(c)
        for g in grp:
            e, a = g["errors"], g.get("errors_after", {})
            if cal is None:
                cell = lambda s, k: (f"{e[s][k + '_median']:.0%} | {e[s][k + '_mean']:.0%} (n={e[s]['n']})"  # noqa: E731
                                     if s in e else "-")
            else:
                cell = lambda s, k: (f"{e[s][k + '_median']:.1%} -> {a[s][k + '_median']:.1%} "  # noqa: E731
                                     f"({a[s]['calibrated_rows']}/{e[s]['n']} cal.)" if s in e else "-")
            t.add_row(g["system"], g["engine"], g["model"], g["mode"], str(g["rows"]),
                      *[cell(s, "ttft") for s in src], *[cell(s, "tpot") for s in src])
        con.print(t)
        if cal is not None:
            b, a = plan["overall"], plan["overall_after"]
            for s in src:
                if s in b:
                    con.print(escape(f"{s}, all rows: TTFT {b[s]['ttft_median']:.1%} -> {a[s]['ttft_median']:.1%}, TPOT "
                                     f"{b[s]['tpot_median']:.1%} -> {a[s]['tpot_median']:.1%} over {b[s]['n']} rows "
                                     f"({a[s]['calibrated_rows']} calibrated by {calibration.name})"))
        _print_reasons(con, rows, "skipped", "not predicted")
        if cal is not None:
            _print_reasons(con, rows, "not_calibrated", "not calibrated")
        for f in files:
            click.echo(f"wrote {f}", err=True)
    sys.exit(0)


def _print_reasons(con, rows, attr: str, what: str) -> None:
    """One line per distinct reason in the rows' ``attr`` (source -> reason), most rows first."""
    from rich.markup import escape

    seen: dict = {}
    for r in rows:
        for s, why in getattr(r, attr).items():
            ids, srcs = seen.setdefault(why, ({}, set()))
            ids[r.id] = None
            srcs.add(s)
    for why, (ids, srcs) in sorted(seen.items(), key=lambda kv: -len(kv[1][0])):
        con.print(escape(f"{what} ({len(ids)} row{'s' if len(ids) > 1 else ''}, "
                         f"{', '.join(sorted(srcs))}): {why}; e.g. {next(iter(ids))}"))


SUBCOMMANDS = {"calibrate": calibrate_cmd, "sweep": sweep_cmd, "estimate": estimate_cmd, "fidelity": fidelity_cmd}


class _Optimize(click.Group):
    """``optimize INSTANCE.yaml [options]`` as before; ``optimize calibrate|sweep ...`` for the
    subcommands (a first argument that is not a subcommand goes to the instance solve)."""

    def parse_args(self, ctx, args):
        if not args or args[0] not in self.commands:  # --help too: the instance solve's help
            args = ["solve", *args]
        return super().parse_args(ctx, args)


cli = _Optimize(name="optimize", commands={"solve": main, **SUBCOMMANDS},
                context_settings={"help_option_names": ["-h", "--help"]},
                help="optimize INSTANCE.yaml [options] (the 'solve' command: see optimize solve --help), "
                     "optimize calibrate MEASUREMENTS.csv ..., optimize sweep GRID.yaml ...")


def run(argv: list[str] | None = None) -> None:
    """Console entry point: like :func:`main`, but a command-line usage error is one line
    (exit code 2) rather than click's usage block. ``argv``: the arguments (default ``sys.argv[1:]``)."""
    try:
        code = cli(args=argv, prog_name="optimize", standalone_mode=False)  # returns only for --help (the commands exit)
    except click.UsageError as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except click.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _finite(obj):
    """``obj`` with every non-finite float (a TTFT of a request that never finished, a ratio over
    zero) as None, so the JSON is strict (RFC 8259 has no NaN or Infinity)."""
    import numpy as np

    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def _dumps(obj, **kw) -> str:
    """Strict JSON of a result: non-finite numbers as null (:func:`_finite`, walked only when the
    result has one, so a large plan keeps the C encoder's speed)."""
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        return json.dumps(_finite(obj), allow_nan=False, **kw)


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
