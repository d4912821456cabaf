"""Pareto fronts of serving instances: monotone, non-dominated, every point re-solves to its value."""
from __future__ import annotations

import json
import random

import pytest

from optimizer.serving import load_problem, solve_instance
from optimizer.serving.pareto import Point, mark_front, pareto
from tests.conftest import INSTANCES, assert_one_line_error
from tests.serving_helpers import llama70b_raw, llama8b_raw

PATH = INSTANCES / "serving_llama70b_h100.yaml"


@pytest.fixture(scope="module")
def llama70b_front():
    return pareto(load_problem(llama70b_raw(), PATH), points=20)


def _assert_front_monotone(curve):
    f = curve.front
    assert f, curve.mode
    for a, b in zip(f, f[1:]):
        assert b.tokens_per_s_per_user > a.tokens_per_s_per_user
        assert b.tokens_per_s_per_gpu < a.tokens_per_s_per_gpu  # more per user, never more per GPU


def _assert_non_dominated(curve):
    ok = [q for q in curve.points if q.status == "ok"]
    for q in curve.front:
        for o in ok:
            dominates = (o.tokens_per_s_per_user >= q.tokens_per_s_per_user and o.tokens_per_s_per_gpu >= q.tokens_per_s_per_gpu
                         and (o.tokens_per_s_per_user > q.tokens_per_s_per_user or o.tokens_per_s_per_gpu > q.tokens_per_s_per_gpu))
            assert not dominates, (q, o)
    for o in ok:  # every point off the front is weakly dominated by a front point
        if not o.on_front:
            assert any(q.tokens_per_s_per_user >= o.tokens_per_s_per_user and q.tokens_per_s_per_gpu >= o.tokens_per_s_per_gpu
                       for q in curve.front), o


def test_llama70b_fronts_monotone_and_both_modes(llama70b_front):
    res = llama70b_front
    assert [c.mode for c in res.curves] == ["aggregated", "disaggregated"]
    assert res.solves == 40
    for c in res.curves:
        assert len(c.points) == 20
        _assert_front_monotone(c)
        _assert_non_dominated(c)
        for q in c.front:
            assert q.label and q.gpus >= 1 and q.status == "ok"


def test_every_point_resolves_to_the_same_value(llama70b_front):
    """A fresh solve (no shared model, no warm start) at each point's targets and mode gives the same
    optimum and plan figures: the warm start changes nothing."""
    for c in llama70b_front.curves:
        for q in c.points:
            if q.status != "ok":
                continue
            raw = llama70b_raw(mode=c.mode)
            raw["serving"]["slo"] = {**raw["serving"]["slo"], "tpot_ms": q.tpot_ms, "ttft_ms": q.ttft_ms}
            rep = solve_instance(load_problem(raw, PATH), simulate_plans=False)
            m = rep.results[0].plans[c.mode]
            d = rep.mode_dict(m)
            assert m.result.value == pytest.approx(q.objective, abs=1e-9)
            assert d["gpus"] == q.gpus
            assert d["analytic"]["tokens_per_s_per_gpu"] == pytest.approx(q.tokens_per_s_per_gpu, rel=1e-9)
            assert d["analytic"]["tokens_per_s_per_user"] == pytest.approx(q.tokens_per_s_per_user, rel=1e-6)


def test_tighter_tpot_never_needs_fewer_gpus(llama70b_front):
    """The feasible set shrinks with the target: the proven minimum GPUs cannot drop."""
    for c in llama70b_front.curves:
        ok = sorted((q for q in c.points if q.status == "ok"), key=lambda q: q.tpot_ms)
        for tight, loose in zip(ok, ok[1:]):
            assert tight.objective >= loose.objective - 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_random_small_instances(seed):
    rng = random.Random(seed)
    raw = llama8b_raw(rate=rng.choice([2.0, 5.0, 12.0]), isl=rng.choice([256, 1024, 4096]), osl=rng.choice([64, 256]),
                      ttft_ms=rng.choice([300.0, 1000.0]), tpot_ms=rng.choice([15.0, 30.0]), servers=2)
    res = pareto(load_problem(raw, INSTANCES / "x.yaml"), points=6)
    for c in res.curves:
        if c.front:
            _assert_front_monotone(c)
        _assert_non_dominated(c)


def test_ttft_sweep_one_curve_per_target():
    res = pareto(load_problem(llama70b_raw(), PATH), "ttft", points=5)
    assert sorted({c.ttft_ms for c in res.curves}) == [500.0, 1000.0, 2000.0]
    by = {(c.mode, c.ttft_ms): c for c in res.curves}
    for mode in ("aggregated", "disaggregated"):
        for tight, loose in ((500.0, 1000.0), (1000.0, 2000.0)):
            for a, b in zip(by[mode, tight].points, by[mode, loose].points):
                assert a.tpot_ms == b.tpot_ms
                if a.status == "ok":  # a tighter TTFT never needs fewer GPUs
                    assert b.status == "ok" and a.objective >= b.objective - 1e-9


def test_mark_front_golden():
    pts = [Point("aggregated", t, 1000, "ok", gpus=1, tokens_per_s_per_user=x, tokens_per_s_per_gpu=y)
           for t, x, y in ((10, 100, 50), (20, 80, 50), (30, 60, 70), (40, 60, 70), (50, 20, 200))]
    pts.append(Point("aggregated", 5, 1000, "infeasible"))
    mark_front(pts)
    assert [q.tpot_ms for q in pts if q.on_front] == [10, 30, 50]


def test_cli_pareto_writes_json_and_png(cli, tmp_path):
    r = cli(PATH, "--pareto", "--pareto-points", "4", "--output", tmp_path, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert {c["mode"] for c in d["plan"]["curves"]} == {"aggregated", "disaggregated"}
    assert (tmp_path / "pareto.png").stat().st_size > 1000
    assert json.loads((tmp_path / "pareto.json").read_text())["solver"]["solves"] == 8


def test_cli_pareto_bad_input(cli, tmp_path):
    assert_one_line_error(cli(PATH, "--pareto"), "--pareto", "--output")
    assert_one_line_error(cli(INSTANCES / "qwen32b_128k.yaml", "--pareto", "--output", tmp_path), "serving instances only")
    # --pareto-points alone was ignored silently
    assert_one_line_error(cli(PATH, "--pareto-points", "5"), "--pareto-points", "only with --pareto")


def test_pareto_stops_at_the_time_limit_and_counts_what_it_skipped(tmp_path):
    """`--pareto ttft --pareto-points 200 --time-limit 2` took 22.7 s (the limit was each solve's
    only). Now the targets stop at the command's budget, each curve keeps its loosest target,
    and the result counts the targets not solved."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "optimizer.cli", str(INSTANCES / "serving_llama70b_h100.yaml"),
                        "--pareto", "ttft", "--pareto-points", "200", "--time-limit", "3", "--output",
                        str(tmp_path / "par"), "--format", "json"], capture_output=True, text=True, timeout=120,
                       cwd=INSTANCES.parent)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)  # (its wall time against the limit: benchmarks/bench_pareto.py --limits)
    cut = d["solver"]["cut_short"]
    assert cut and cut[0].endswith("targets not solved before the time limit")
    assert d["status"] == "feasible"  # its front points are proven, the front is not whole (was "optimal")
    curves = d["plan"]["curves"]
    assert all(len(c["points"]) >= 1 for c in curves) and d["solver"]["solves"] < 200 * len(curves)
    assert (tmp_path / "par" / "pareto.png").exists()
    # without a limit nothing is cut
    res = pareto(load_problem(llama70b_raw(), INSTANCES / "serving_llama70b_h100.yaml"), points=4)
    assert res.not_solved == 0 and res.to_dict()["solver"]["cut_short"] == []


def test_pareto_with_an_slo_no_worker_meets(cli, tmp_path):
    """TTFT 1 ms: exit 3 with two empty fronts, no best achievable and an empty pareto.png; now
    the best achievable TTFT (as a plain run gives) and no figure."""
    r = cli(PATH, "--pareto", "--output", tmp_path / "p", "--set", "serving.slo.ttft_ms=1", "--format", "json")
    assert r.exit_code == 3, r.output
    d = json.loads((tmp_path / "p" / "pareto.json").read_text())
    assert d["status"] == "infeasible" and d["achievable"]["requirement"] == "ttft_ms"
    assert d["achievable"]["best"] > d["achievable"]["required"] == 1.0
    assert not (tmp_path / "p" / "pareto.png").exists()
