"""Issue 7: the printed time is the whole run, OR-Tools writes nothing to the user's stderr,
and the installed-rack layout is computed per group of identical racks (it was per rack,
98 % of a 2.5 s run at 50 MW). Speed itself is measured in benchmarks/bench_buildout.py."""
from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time

import pytest
from rich.console import Console

import optimizer.buildout.explain as buildout_explain
from optimizer.buildout.model import installed_racks
from optimizer.buildout.patterns import RackPattern
from optimizer.buildout.schema import load
from tests.buildout_helpers import EXAMPLE, MIXED, REPO, SECOND_TIER, raw_of, report_of, run_json
from tests.test_buildout_cli import _doc_commands

_BATCH = """
import json, sys, yaml
from pathlib import Path
from click.testing import CliRunner
from optimizer.cli import main
from tests.buildout_helpers import hall_cases as cases
runs = json.loads(sys.argv[1])
out = []
for args in runs:  # the README's build-out commands, in this process (C++ output goes to fd 2)
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    out.append([args, r.exit_code, r.stderr])
tmp = Path(sys.argv[2])
for i, (label, raw) in enumerate(cases()):
    path = tmp / f"case{i}.yaml"
    path.write_text(yaml.safe_dump(raw))
    for objective in ("gpus", "cost", "racks"):
        r = CliRunner().invoke(main, [str(path), "--objective", objective, "--format", "json"], catch_exceptions=False)
        out.append([label + " " + objective, r.exit_code, r.stderr + ("" if json.loads(r.stdout)["status"] == "optimal" else "not optimal")])
print(json.dumps(out))
"""


def test_readme_and_benchmark_cases_leave_stderr_empty(tmp_path):
    """Every README build-out command and every benchmark case (120 kW to 50 MW, three
    objectives) in one real process: OR-Tools' C++ logging would bypass Python's sys.stderr,
    so the process's own stderr must stay empty."""
    runs = [[str(REPO / parts[0])] + parts[1:] for parts in _doc_commands()]
    assert len(runs) >= 8
    out = subprocess.run([sys.executable, "-c", _BATCH, json.dumps(runs), str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr == ""
    results = json.loads(out.stdout)
    assert len(results) == len(runs) + 12
    for what, code, err in results:
        assert code in (0, 3) and err == "", (what, code, err)


def test_cli_process_stderr_empty():
    out = subprocess.run([sys.executable, "-m", "optimizer.cli", str(EXAMPLE)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "" and "solver cp-sat: optimal" in out.stdout


def _printed_times(report) -> tuple[float, float]:
    con = Console(width=200, record=True, file=open("/dev/null", "w"))
    report.render(con)
    line = [ln for ln in con.export_text().splitlines() if ln.startswith("solver cp-sat")][-1]
    m = re.search(r"([0-9.]+) s \(CP-SAT ([0-9.]+) s\)", line)
    return float(m.group(1)), float(m.group(2))


@pytest.mark.parametrize("path,changes", [(EXAMPLE, {}), (SECOND_TIER, {}), (MIXED, {}),
                                          (EXAMPLE, {"buildout__target_gpus": 96})])
def test_printed_time_is_the_json_whole_run_time(path, changes):
    report = report_of(raw_of(path, **changes), path=path)
    d = report.to_dict()["solver"]
    printed, cp_sat = _printed_times(report)
    assert printed == pytest.approx(round(d["time_s"], 3), abs=1e-9)
    assert cp_sat == pytest.approx(round(d["cp_sat_time_s"], 3), abs=1e-9)
    assert d["time_s"] >= d["cp_sat_time_s"] > 0
    assert d["time_s"] == report.total_time_s == report.solution.wall_s + report.explanation.wall_s


def test_whole_run_time_includes_the_explanation(monkeypatch):
    """A 0.2 s delay in the explanation shows in the reported time, not in the CP-SAT time."""
    real = buildout_explain.bindings

    def slow(*a, **k):
        time.sleep(0.2)
        return real(*a, **k)

    monkeypatch.setattr(buildout_explain, "bindings", slow)
    t0 = time.perf_counter()
    report = report_of(raw_of(EXAMPLE), path=EXAMPLE)
    outer = time.perf_counter() - t0
    d = report.to_dict()["solver"]
    assert d["time_s"] >= 0.2 + d["cp_sat_time_s"]
    assert d["time_s"] <= outer


def _installed_per_rack(p, racks, items):
    """Reference: expand every rack, take the surplus back from the last racks one by one."""
    single = [[pat.cooling, list(pat.counts)] for pat, mult in racks for _ in range(mult)]
    for i, want in enumerate(items):
        extra = sum(r[1][i] for r in single) - want
        for r in reversed(single):
            if extra <= 0:
                break
            take = min(extra, r[1][i])
            r[1][i] -= take
            extra -= take
    grouped: dict[tuple, int] = {}
    for cooling, counts in single:
        if any(counts):
            grouped[(cooling, tuple(counts))] = grouped.get((cooling, tuple(counts)), 0) + 1
    return list(grouped.items())


@pytest.mark.parametrize("seed", range(40))
def test_grouped_installed_racks_equal_per_rack(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 3)
    types = [{"name": f"t{i}", "gpus": 8, "power_kw": 1.0, "rack_units": 1} for i in range(n)]
    p = load(raw_of(EXAMPLE, buildout__server_types=types), "x.yaml", "gpus")
    racks = [(RackPattern(rng.choice(["air", "liquid"]), tuple(rng.randint(0, 4) for _ in range(n)), 0, 0),
              rng.randint(1, 6)) for _ in range(rng.randint(1, 5))]
    racks = [(pat, m) for pat, m in racks if any(pat.counts)] or [(RackPattern("air", (1,) * n, 0, 0), 1)]
    have = [sum(pat.counts[i] * m for pat, m in racks) for i in range(n)]
    want = [rng.randint(0, h) for h in have]
    got = installed_racks(p, racks, want)
    assert [((pat.cooling, pat.counts), m) for pat, m in got] == _installed_per_rack(p, racks, want)
    assert [sum(pat.counts[i] * m for pat, m in got) for i in range(n)] == want
    for pat, _m in got:
        assert pat.power_w == sum(c * 1000 for c in pat.counts) and pat.units == sum(pat.counts)


def test_solver_parameters_never_run_lns_or_log():
    """The 'Infeasible LNS solution!' dump comes from LNS workers (absl LOG(ERROR) to fd 2):
    the build-out's CP-SAT solves must not run LNS nor log the search."""
    from ortools.sat.python import cp_model

    from optimizer.buildout.solve import solver_parameters

    s = cp_model.CpSolver()
    solver_parameters(s, 5.0)
    assert s.parameters.use_lns is False and s.parameters.log_search_progress is False
    assert s.parameters.max_time_in_seconds == 5.0


def test_unsettled_one_worker_stage_is_resolved_with_two_workers(monkeypatch):
    """A stage one worker has not proven is solved again with SEARCH_WORKERS workers, and the
    plan is the same as when every stage is settled at once."""
    import sys as _sys

    from ortools.sat.python import cp_model

    solve_mod = _sys.modules["optimizer.buildout.solve"]
    real = solve_mod._solve_once
    calls = []

    def fake(model, limit, workers):
        calls.append(workers)
        code, solver = real(model, limit, workers)
        if workers == 1:
            return cp_model.UNKNOWN, solver  # pretend the one-worker try ran out of time
        return code, solver

    want = report_of(raw_of(SECOND_TIER), path=SECOND_TIER).to_dict()["plan"]
    monkeypatch.setattr(solve_mod, "_solve_once", fake)
    got = report_of(raw_of(SECOND_TIER), path=SECOND_TIER)
    assert got.status.value == "optimal" and got.to_dict()["plan"] == want
    assert calls.count(1) == calls.count(solve_mod.SEARCH_WORKERS) > 0


def test_short_limit_counts_the_skipped_what_ifs_and_keeps_the_plan(tmp_path):
    """A fresh user's 40 inline server types in a 50 MW hall: `--time-limit 2` took 4.1 s (the
    limit went to the solve alone, the explanation's what-if solves came on top, and start-up
    was not counted). Now the what-ifs it skipped are counted in `solver.cut_short` and the plan
    still passes the evaluator (inside the run); the whole command's wall time against the limit
    is measured by ``benchmarks/bench_buildout.py --limits``."""
    import yaml

    types = [{"name": f"t{i}", "gpus": 4 if i % 2 == 0 else 8, "power_kw": round(3.1 + 0.37 * i, 2),
              "rack_units": 2 + i % 5, "cost": 50000 + 1234 * i} for i in range(40)]
    raw = {"name": "40 server types", "buildout": {
        "power_budget_kw": 50000, "fixed_power_kw": 100, "install_unit_servers": 2, "target_gpus": 20000,
        "server_types": types,
        "racks": {"air_cooled_kw": 40, "liquid_cooled_kw": 130, "rack_units": 48, "feed_kw": 21.6,
                  "redundant_feeds": True, "max_utilization": 0.8},
        "fabric": {"gpu_links": 1, "port_bandwidth_gb_s": 50, "switch_radix": 64, "max_oversubscription": 3.0,
                   "one_tier_max_gpus": 64, "second_tier_power_kw": 25, "switch_power_kw": 0.7,
                   "switch_rack_units": 1}}}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    # in-process: the limit counts from the command's start (tests/conftest.py); in a fresh
    # process under a loaded machine the interpreter's start-up alone took most of the 2 s
    code, d = run_json(path, "--time-limit", "2")  # (its wall time against the limit: bench_buildout.py --limits)
    assert code == 0, d["status"]
    assert d["status"] in ("optimal", "feasible") and d["plan"] is not None
    assert d["objective"]["value"] >= 20000
    assert all("what-if solves skipped" in c for c in d["solver"]["cut_short"])


def test_pipeline_protocol_and_frozen_solution():
    """The build-out is on the one pipeline (no old ``run``); its solution and explanation
    cannot be changed after the solve, and the report reads them as they are."""
    import dataclasses

    from optimizer.budget import Budget
    from optimizer.buildout import PIPELINE
    from optimizer.problems import Pipeline

    import optimizer.buildout as pkg

    assert isinstance(PIPELINE, Pipeline) and not hasattr(pkg, "run")
    p = PIPELINE.load(raw_of(EXAMPLE), EXAMPLE)
    assert p.objective.name == "gpus" and p.objective.sense == "max"
    sol = PIPELINE.solve(p, Budget.unlimited())
    with pytest.raises(dataclasses.FrozenInstanceError):
        sol.value = 0
    ex = PIPELINE.explain(p, sol, Budget.unlimited())
    with pytest.raises(dataclasses.FrozenInstanceError):
        ex.binding = ()
    rep = PIPELINE.report(p, sol, ex)
    assert rep.to_dict()["objective"]["value"] == sol.value == 88
    assert [b.to_dict() for b in ex.binding] == rep.to_dict()["binding"]
    assert PIPELINE.evaluate(p, sol.plan) == sol.evaluation
