"""``optimize sweep GRID.yaml``: one serving solve per point of a grid over instance fields.

Grid file::

    base: serving_llama70b_h100.yaml        # a serving instance (relative to the grid file)
    grid:                                   # dotted instance fields -> values (cartesian product)
      model.config: [models/llama-3.1-70b.json, models/llama-3.1-8b.json]
      hardware:                             # a mapping value is merged into that field
        - {gpu: h100-sxm, server: hgx-h100}
        - {gpu: h200-sxm, server: hgx-h200}
      serving.traffic.rate_rps: [5, 10, 20]
      serving.mode: [aggregated, disaggregated]

Paths inside values (``model.config``) are read relative to the base instance, as in the instance.
Every single value is checked up front against the schema (an unknown field or a bad value -> one
line naming the grid file and ``grid.<field>``, exit 2); a combination that fails only together,
or a point without a plan, is a row with its status and reason.

Rows (CSV and JSON, one per point, sorted by point): ``point`` (index in the product), the fields
varied (a mapping value gives one column per key), ``status`` (``optimal``/``feasible``/
``infeasible``/``time_limit``/``error``), ``reason``, ``mode`` (best), ``objective``, ``gpus``,
``dollars_per_hour``, ``tokens_per_s_per_gpu``, ``tokens_per_s_per_user`` (analytic),
``ttft_ms``/``tpot_ms`` analytic (at the checked quantile) and simulated (p90; p50/p99 in JSON),
``attainment`` simulated. Rows hold no timings, so a rerun or a cluster run gives identical rows.

Execution: a local process pool (default) or a Dask cluster (``scheduler=ADDRESS``,
:mod:`distributed`), with a rich progress bar. Each finished row is appended to ``sweep.csv`` at
once; a rerun skips the points already there (resume).
"""
from __future__ import annotations

import copy
import csv
import itertools
import json
import math
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from optimizer.errors import InputError

RESULT_COLUMNS = ("status", "reason", "mode", "objective", "gpus", "dollars_per_hour", "tokens_per_s_per_gpu",
                  "tokens_per_s_per_user", "ttft_ms_analytic", "tpot_ms_analytic", "ttft_ms_p90_simulated",
                  "tpot_ms_p90_simulated", "attainment_simulated")
NUMERIC = {"objective", "dollars_per_hour", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "ttft_ms_analytic",
           "tpot_ms_analytic", "ttft_ms_p90_simulated", "tpot_ms_p90_simulated", "attainment_simulated"}


@dataclass
class Grid:
    """A parsed grid: ``base`` raw instance and its path; ``fields`` the grid keys in file order with
    their values; ``columns`` the varied columns (mapping values flattened)."""

    path: Path
    base_path: Path
    base: dict
    fields: list[tuple[str, list]]
    columns: list[str]

    def points(self) -> list[dict[str, Any]]:
        """Every point as ``{grid key: value}``, in product order (last key varies fastest)."""
        keys = [k for k, _ in self.fields]
        return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in self.fields))]

    def varied(self, point: dict[str, Any]) -> dict[str, Any]:
        """The point's column values (``hardware: {gpu, server}`` -> ``hardware.gpu``, ``hardware.server``)."""
        out = {}
        for k, v in point.items():
            if isinstance(v, dict):
                for kk, vv in v.items():
                    out[f"{k}.{kk}"] = vv
            else:
                out[k] = v
        return out


def apply_point(base: dict, point: dict[str, Any]) -> dict:
    """A copy of ``base`` with every ``dotted.key: value`` of the point set (mappings merged)."""
    raw = copy.deepcopy(base)
    for key, value in point.items():
        parts = key.split(".")
        node = raw
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        last = parts[-1]
        if isinstance(value, dict) and isinstance(node.get(last), dict):
            node[last] = {**node[last], **copy.deepcopy(value)}
        else:
            node[last] = copy.deepcopy(value)
    return raw


def _field_error(grid: Path, key: str, i: int, exc: InputError) -> InputError:
    return InputError(grid, f"grid.{key}[{i}]", f"{exc.field + ': ' if exc.field else ''}{exc.problem}")


def load_grid(path: Path) -> Grid:
    """Read and check a grid file (module docstring).

    Raises:
        InputError: missing file/base, an empty or non-list field, a field the instance schema does
            not know, a value the schema rejects (each value checked alone on the base instance).
    """
    from pydantic import ValidationError

    from optimizer.schema_base import read_yaml
    from optimizer.serving import load_problem
    from optimizer.serving.schema import InstanceIn

    path = Path(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise InputError(path, "", "a grid file is a mapping with base: and grid:")
    unknown = sorted(set(raw) - {"base", "grid", "name"})
    if unknown:
        raise InputError(path, unknown[0], "unknown field (a grid file has base, grid and name)")
    if not isinstance(raw.get("base"), str):
        raise InputError(path, "base", "required field is missing (path to a serving instance)")
    base_path = (path.parent / raw["base"]).resolve()
    base = read_yaml(base_path)
    if not isinstance(base, dict) or "serving" not in base:
        raise InputError(path, "base", f"{base_path} is not a serving instance (no serving: section)")
    g = raw.get("grid")
    if not isinstance(g, dict) or not g:
        raise InputError(path, "grid", "required field is missing (a mapping of dotted fields to lists of values)")
    fields: list[tuple[str, list]] = []
    for key, values in g.items():
        key = str(key)
        if not isinstance(values, list) or not values:
            raise InputError(path, f"grid.{key}", "expected a non-empty list of values")
        for i, v in enumerate(values):
            one = apply_point(base, {key: v})
            try:
                InstanceIn.model_validate(one)
            except ValidationError as err:
                extra = [e for e in err.errors() if e["type"] == "extra_forbidden"]
                if extra:
                    loc = ".".join(str(x) for x in extra[0]["loc"])
                    raise InputError(path, f"grid.{key}", f"unknown instance field '{loc}'") from None
        fields.append((key, list(values)))
    for key, values in fields:  # a value no combination with the other fields' values can load
        others = [(k, vs) for k, vs in fields if k != key]
        for i, v in enumerate(values):
            err = _loads_in_some_point(base, base_path, key, v, others)
            if err is not None:
                raise _field_error(path, key, i, err) from None
    cols: list[str] = []
    for key, values in fields:
        for v in values:
            for c in (Grid(path, base_path, base, [], []).varied({key: v})):
                if c not in cols:
                    cols.append(c)
    return Grid(path, base_path, base, fields, cols)


COMBINATIONS_CHECKED = 256  # per value: the other fields' combinations tried before it is called bad input


def _loads_in_some_point(base: dict, base_path: Path, key: str, value, others) -> Optional[InputError]:
    """None when ``key = value`` loads with the base's other fields or with one of the first
    ``COMBINATIONS_CHECKED`` combinations of the other grid fields' values (a value that fails
    only in some combinations is a row of the sweep, not bad input); else the error with the
    base's other fields."""
    from optimizer.serving import load_problem

    first = None
    combos = itertools.product(*[[(k, x) for x in vs] for k, vs in others])
    for combo in itertools.chain([()], itertools.islice(combos, COMBINATIONS_CHECKED)):
        try:
            load_problem(apply_point(base, {key: value, **dict(combo)}), base_path)
            return None
        except InputError as exc:
            first = first or exc
    return first


# ----------------------------------------------------------------------------- one point
def _num(x) -> Optional[float]:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def run_point(base: dict, base_path: str, point: dict[str, Any], time_limit_s: Optional[float] = None) -> dict:
    """Solve one point; never raises: a failure is a row with status ``error`` and the reason.
    Returns the result columns (:data:`RESULT_COLUMNS`)."""
    row: dict[str, Any] = {c: None for c in RESULT_COLUMNS}
    try:
        import time

        from optimizer.budget import Budget
        from optimizer.serving import closed_loop_rates, load_problem, solve_instance

        raw = apply_point(base, point)
        p = closed_loop_rates(load_problem(raw, Path(base_path)))  # closed-loop users: the rate they generate
        if len(p.rates) != 1:
            raise InputError(base_path, "serving.traffic.rate_rps",
                             f"a sweep point takes one rate (got {len(p.rates)}): put the rates in the grid")
        rep = solve_instance(p, Budget.for_command(time_limit_s, started=time.perf_counter()))  # --time-limit is per point
        row["status"] = rep.status.value
        rr = rep.results[0]
        best = rep.best(rr)
        if best is None:
            groups = rep.explanation.conflicts
            row["reason"] = "; ".join(f"{g['family']}: {g['details'][0]}" for g in groups)[:500] or "no plan"
            return row
        md = rep.mode_dict(best)
        a, s = md["analytic"], md.get("simulated") or {}
        row.update({"reason": "", "mode": best.mode, "objective": _num(md["objective"]), "gpus": int(md["gpus"]),
                    "dollars_per_hour": _num(md["dollars_per_hour"]),
                    "tokens_per_s_per_gpu": _num(a["tokens_per_s_per_gpu"]),
                    "tokens_per_s_per_user": _num(a["tokens_per_s_per_user"]),
                    "ttft_ms_analytic": _num(a["ttft_ms"]), "tpot_ms_analytic": _num(a["tpot_ms"]),
                    "ttft_ms_p90_simulated": _num((s.get("ttft_ms") or {}).get("p90")),
                    "tpot_ms_p90_simulated": _num((s.get("tpot_ms") or {}).get("p90")),
                    "attainment_simulated": _num(s.get("attainment"))})
        row["_simulated"] = s or None
    except InputError as exc:
        row.update({"status": "error", "reason": exc.line()})
    except Exception as exc:  # noqa: BLE001 - a point never crashes the sweep
        row.update({"status": "error", "reason": f"{type(exc).__name__}: {exc}"})
    return row


# ----------------------------------------------------------------------------- files
def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    if isinstance(v, float):
        return repr(v)
    return str(v)


def read_done(csv_path: Path, columns: list[str]) -> dict[int, dict]:
    """Rows already in ``csv_path`` by point index (a torn last line from an interrupted run is ignored).

    Raises:
        InputError: the file's header is not this grid's columns.
    """
    if not csv_path.is_file():
        return {}
    with csv_path.open(newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            return {}
        if header != columns:
            raise InputError(csv_path, "header", "the existing results are from another grid (columns differ): "
                                                 "use another --output folder")
        done = {}
        for rec in reader:
            if len(rec) != len(columns) or not rec[0].isdigit() or rec[columns.index("status")] == "":
                continue
            done[int(rec[0])] = dict(zip(columns, rec))
    return done


def _parse(rec: dict[str, str], varied: list[str]) -> dict[str, Any]:
    """A CSV row back to typed values (numbers as floats, gpus/point as ints, empty as None)."""
    out: dict[str, Any] = {}
    for k, v in rec.items():
        if v == "":
            out[k] = None
        elif k in ("point", "gpus"):
            out[k] = int(v)
        elif k in NUMERIC:
            out[k] = float(v)
        elif k in varied:
            try:
                out[k] = json.loads(v)
            except ValueError:
                out[k] = v
        else:
            out[k] = v
    return out


@dataclass
class SweepResult:
    grid: Grid
    rows: list[dict]
    ran: int
    skipped: int
    files: list[Path]


def _connect(scheduler: str):
    """A Dask client for ``scheduler`` (``tcp://host:port``).

    Raises:
        InputError: a malformed address, or no scheduler answers within 10 s (names --scheduler).
    """
    from distributed import Client

    try:
        return Client(scheduler, timeout="10s")
    except (ValueError, TypeError) as exc:
        raise InputError("--scheduler", scheduler, f"not a scheduler address ({exc}); expected tcp://HOST:PORT") from None
    except (OSError, TimeoutError) as exc:
        raise InputError("--scheduler", scheduler, f"no Dask scheduler answered within 10 s ({exc})") from None


def run_sweep(grid: Grid, out_dir: Path, scheduler: Optional[str] = None, workers: Optional[int] = None,
              time_limit_s: Optional[float] = None, progress: bool = True,
              on_row: Optional[Callable[[int, dict], None]] = None) -> SweepResult:
    """Run every point not already in ``out_dir/sweep.csv``; write ``sweep.csv`` and ``sweep.json``.

    ``scheduler``: a Dask scheduler address (``tcp://host:8786``), else a local process pool of
    ``workers`` processes (default: CPU count, at most 4). ``on_row(point, row)`` is called as rows
    finish (tests use it to interrupt).
    """
    client = _connect(scheduler) if scheduler else None  # before any file is written
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "sweep.csv"
    columns = ["point"] + grid.columns + list(RESULT_COLUMNS)
    done = read_done(csv_path, columns)
    points = grid.points()
    todo = [i for i in range(len(points)) if i not in done]
    new_file = not csv_path.is_file() or csv_path.stat().st_size == 0
    if not new_file and done == {} and csv_path.read_text().strip() == "":
        new_file = True
    if not new_file:  # drop a torn last line before appending
        text = csv_path.read_text()
        if not text.endswith("\n"):
            csv_path.write_text(text[: text.rfind("\n") + 1])
    sims: dict[int, Any] = {}
    with csv_path.open("a", newline="") as fh:
        w = csv.writer(fh)
        if new_file:
            w.writerow(columns)
            fh.flush()

        def record(i: int, row: dict) -> None:
            sims[i] = row.pop("_simulated", None)
            varied = grid.varied(points[i])
            w.writerow([str(i)] + [_cell(varied.get(c)) for c in grid.columns] + [_cell(row[c]) for c in RESULT_COLUMNS])
            fh.flush()
            if on_row is not None:
                on_row(i, row)

        args = (grid.base, str(grid.base_path))
        with _progress(progress, len(points), len(done)) as bar:
            if client is not None:
                from distributed import as_completed as dask_completed

                with client:
                    futs = {client.submit(run_point, *args, points[i], time_limit_s, pure=False): i for i in todo}
                    for f in dask_completed(list(futs)):
                        record(futs[f], f.result())
                        bar()
            elif todo:
                import multiprocessing as mp

                n = workers or min(4, os.cpu_count() or 1)
                # fresh worker processes (forkserver/spawn), never fork: a process that has run HiGHS
                # before (its thread pool) hangs in a forked child
                method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
                with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context(method)) as pool:
                    futs = {pool.submit(run_point, *args, points[i], time_limit_s): i for i in todo}
                    for f in as_completed(futs):
                        record(futs[f], f.result())
                        bar()
    # final files: every row, sorted by point
    rows_raw = read_done(csv_path, columns)
    rows = [_parse(rows_raw[i], grid.columns) for i in sorted(rows_raw)]
    tmp = out_dir / "sweep.csv.tmp"
    with tmp.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(columns)
        for i in sorted(rows_raw):
            w.writerow([rows_raw[i][c] for c in columns])
    tmp.replace(csv_path)
    js = out_dir / "sweep.json"
    js.write_text(json.dumps({"grid": str(grid.path), "base": str(grid.base_path), "columns": columns,
                              "points": len(points), "rows": rows}, indent=2))
    return SweepResult(grid, rows, len(todo), len(done), [csv_path, js])


class _progress:
    """A rich progress bar (``total`` points, ``done`` already there); a no-op when disabled."""

    def __init__(self, enabled: bool, total: int, done: int):
        self.enabled, self.total, self.done = enabled, total, done
        self._p = None

    def __enter__(self):
        if self.enabled:
            import sys

            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

            self._p = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), TimeRemainingColumn(), console=Console(file=sys.stderr))
            self._p.start()
            self._t = self._p.add_task("sweep", total=self.total, completed=self.done)
        return self

    def __call__(self):
        if self._p is not None:
            self._p.advance(self._t)

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.stop()
        return False
