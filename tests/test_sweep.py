"""Grid sweeps: local process pool and a Dask LocalCluster give the same rows; resume; failing points are rows."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from optimizer.errors import InputError
from optimizer.sweep import load_grid, run_sweep
from tests.conftest import INSTANCES, assert_one_line_error
from tests.serving_helpers import llama8b_raw


def _base(tmp_path: Path) -> Path:
    raw = llama8b_raw(rate=4.0, isl=1024, osl=128, ttft_ms=500.0, tpot_ms=30.0, servers=1)
    raw["model"]["config"] = str(INSTANCES / "models" / "llama-3.1-8b.json")
    raw["serving"]["simulation"] = {"enabled": True, "requests": 200, "seed": 3}
    p = tmp_path / "base.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def _grid(tmp_path: Path, grid: dict, name: str = "grid.yaml") -> Path:
    _base(tmp_path)
    g = tmp_path / name
    g.write_text(yaml.safe_dump({"base": "base.yaml", "grid": grid}, sort_keys=False))
    return g


GRID_2x2x3 = {"hardware": [{"gpu": "h100-sxm", "server": "hgx-h100"}, {"gpu": "h200-sxm", "server": "hgx-h200"}],
              "serving.slo.tpot_ms": [15, 30],
              "serving.traffic.rate_rps": [2, 8, 2000]}


def _csv_rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as fh:
        return list(csv.reader(fh))


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("local")
    g = load_grid(_grid(tmp, GRID_2x2x3))
    res = run_sweep(g, tmp / "out", workers=2, progress=False)
    return tmp, g, res


def test_local_grid_rows(local_run):
    tmp, g, res = local_run
    assert len(res.rows) == 12 and res.ran == 12 and res.skipped == 0
    assert g.columns == ["hardware.gpu", "hardware.server", "serving.slo.tpot_ms", "serving.traffic.rate_rps"]
    rows = {(r["hardware.gpu"], r["serving.slo.tpot_ms"], r["serving.traffic.rate_rps"]): r for r in res.rows}
    assert len(rows) == 12
    ok = [r for r in res.rows if r["status"] == "optimal"]
    assert ok, res.rows
    for r in ok:
        assert r["gpus"] >= 1 and r["tokens_per_s_per_gpu"] == pytest.approx(
            r["serving.traffic.rate_rps"] * 128 / r["gpus"])
        assert r["tpot_ms_analytic"] <= r["serving.slo.tpot_ms"] + 1e-9
        assert r["attainment_simulated"] >= 0.9 and r["ttft_ms_p90_simulated"] > 0
    # 2000 req/s cannot fit one 8-GPU server: a row with status and reason, not a crash
    big = [r for r in res.rows if r["serving.traffic.rate_rps"] == 2000]
    assert big and all(r["status"] == "infeasible" and r["reason"] for r in big)
    js = json.loads((tmp / "out" / "sweep.json").read_text())
    assert js["rows"] == res.rows


def test_dask_local_cluster_gives_identical_rows(local_run, tmp_path):
    from distributed import LocalCluster

    _, g, res = local_run
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        dres = run_sweep(g, tmp_path / "dask", scheduler=cluster.scheduler_address, progress=False)
    assert dres.rows == res.rows
    assert _csv_rows(tmp_path / "dask" / "sweep.csv") == _csv_rows(local_run[0] / "out" / "sweep.csv")


def test_interrupted_sweep_resumes(local_run, tmp_path):
    _, g, res = local_run

    class Stop(Exception):
        pass

    seen = []

    def stop_after_4(i, row):
        seen.append(i)
        if len(seen) == 4:
            raise Stop

    with pytest.raises(Stop):
        run_sweep(g, tmp_path / "r", workers=1, progress=False, on_row=stop_after_4)
    done = _csv_rows(tmp_path / "r" / "sweep.csv")
    assert len(done) == 1 + 4
    with (tmp_path / "r" / "sweep.csv").open("a") as fh:  # a torn line from a kill mid-write
        fh.write("7,h200-sxm,hgx-h")
    again = run_sweep(g, tmp_path / "r", workers=1, progress=False)
    assert again.skipped == 4 and again.ran == 8
    assert again.rows == res.rows
    third = run_sweep(g, tmp_path / "r", workers=1, progress=False)
    assert third.ran == 0 and third.rows == res.rows


def test_bad_combination_is_a_row(tmp_path):
    """isl 120000 and osl 20000 are each fine for Llama 3.1 8B, together over its 131072-token context."""
    g = load_grid(_grid(tmp_path, {"serving.traffic.isl": [1024, 120000], "serving.traffic.osl": [128, 20000],
                                   "serving.simulation.enabled": [False]}))
    res = run_sweep(g, tmp_path / "o", workers=1, progress=False)
    assert len(res.rows) == 4
    bad = [r for r in res.rows if r["serving.traffic.isl"] == 120000 and r["serving.traffic.osl"] == 20000]
    assert bad[0]["status"] == "error" and "exceeds the model's maximum length" in bad[0]["reason"]


def test_closed_loop_points_are_sized_for_their_users(tmp_path):
    """A fresh user's sweep over serving.traffic.concurrency ended every point in an error (the
    sweep sized for the rates it had, none): a closed-loop point is sized as `optimize` sizes it."""
    g = load_grid(_grid(tmp_path, {"serving.traffic.concurrency": [4, 16], "serving.traffic.rate_rps": [None]}))
    res = run_sweep(g, tmp_path / "o", workers=1, progress=False)
    assert [r["status"] for r in res.rows] == ["feasible", "feasible"]
    assert res.rows[0]["gpus"] <= res.rows[1]["gpus"]


def test_value_bad_only_with_the_base_is_checked_against_the_grid(tmp_path):
    """isl 131000 with the base's osl 128 is over the context, with the grid's osl 64 it is not: a
    fresh user's grid was refused as bad input; the value loads with some combination of the
    other fields, so its bad combinations are rows. A value bad in every combination stays bad
    input."""
    g = load_grid(_grid(tmp_path, {"serving.traffic.isl": [1024, 131000], "serving.traffic.osl": [64, 4000],
                                   "serving.simulation.enabled": [False]}))
    res = run_sweep(g, tmp_path / "o", workers=1, progress=False)
    bad = [r for r in res.rows if r["serving.traffic.isl"] == 131000 and r["serving.traffic.osl"] == 4000]
    assert bad[0]["status"] == "error" and "exceeds the model's maximum length" in bad[0]["reason"]
    with pytest.raises(InputError, match=r"grid.serving.traffic.isl\[1\]"):
        load_grid(_grid(tmp_path, {"serving.traffic.isl": [1024, 140000], "serving.traffic.osl": [64, 4000]}, "g2.yaml"))


def test_repo_grid_loads():
    g = load_grid(INSTANCES / "sweep_llama70b_h100_h200.yaml")
    assert len(g.points()) == 48
    assert {"model.config", "hardware.gpu", "serving.traffic.rate_rps", "serving.slo.tpot_ms", "serving.mode"} <= set(g.columns)


def test_cli_sweep_runs_and_resumes(cli_any, tmp_path):
    g = _grid(tmp_path, {"serving.traffic.rate_rps": [1, 2], "serving.simulation.enabled": [False]})
    r = cli_any("sweep", g, "--output", tmp_path / "o", "--workers", "1", "--no-progress")
    assert r.exit_code == 0, r.output
    assert "2 solved now" in r.stderr
    r = cli_any("sweep", g, "--output", tmp_path / "o", "--workers", "1", "--no-progress")
    assert r.exit_code == 0 and "0 solved now, 2 already done" in r.stderr


def test_grid_given_to_the_instance_solve_says_so(cli_any):
    assert_one_line_error(cli_any(INSTANCES / "sweep_llama70b_h100_h200.yaml"), "sweep_llama70b_h100_h200.yaml", "grid",
                          "optimize sweep")


def test_cli_sweep_bad_input(cli_any, tmp_path):
    g = _grid(tmp_path, {"serving.traffic.rate_rps": [1, -2]}, "neg.yaml")
    assert_one_line_error(cli_any("sweep", g, "--output", tmp_path / "o"), "neg.yaml", "grid.serving.traffic.rate_rps[1]",
                          "positive")
    g = _grid(tmp_path, {"serving.trafic.rate_rps": [1]}, "unknown.yaml")
    assert_one_line_error(cli_any("sweep", g, "--output", tmp_path / "o"), "unknown.yaml", "grid.serving.trafic.rate_rps",
                          "unknown")
    g = _grid(tmp_path, {"serving.traffic.rate_rps": []}, "empty.yaml")
    assert_one_line_error(cli_any("sweep", g, "--output", tmp_path / "o"), "empty.yaml", "non-empty list")
    (tmp_path / "nobase.yaml").write_text("grid: {serving.mode: [aggregated]}\n")
    assert_one_line_error(cli_any("sweep", tmp_path / "nobase.yaml", "--output", tmp_path / "o"), "nobase.yaml", "base")
    assert_one_line_error(cli_any("sweep", g), "--output")


def test_cli_sweep_on_a_scheduler_matches_local(cli_any, tmp_path):
    from distributed import LocalCluster

    g = _grid(tmp_path, {"serving.traffic.rate_rps": [1, 3], "serving.mode": ["aggregated", "disaggregated"],
                         "serving.simulation.enabled": [False]})
    r = cli_any("sweep", g, "--output", tmp_path / "local", "--workers", "1", "--no-progress")
    assert r.exit_code == 0, r.output
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        r = cli_any("sweep", g, "--output", tmp_path / "dask", "--scheduler", cluster.scheduler_address, "--no-progress")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "dask" / "sweep.csv").read_text() == (tmp_path / "local" / "sweep.csv").read_text()


def test_bad_scheduler_address_is_one_line_and_writes_nothing(tmp_path):
    """A malformed --scheduler is named in one line (exit 2) before any output file is written."""
    import subprocess
    import sys

    from tests.conftest import REPO

    grid = tmp_path / "g.yaml"
    grid.write_text(f"base: {REPO / 'instances' / 'serving_llama70b_h100.yaml'}\n"
                    "grid:\n  serving.traffic.rate_rps: [1, 2]\n")
    r = subprocess.run([sys.executable, "-m", "optimizer.cli", "sweep", str(grid), "--output", str(tmp_path / "out"),
                        "--scheduler", "garbage"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--scheduler" in r.stderr
    assert not (tmp_path / "out").exists()
