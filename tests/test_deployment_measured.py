"""The deployment problem under the measured step-time source (aiconfigurator-core's kernel
database): the same exhaustive-search check as the analytic path on random batched instances
(MoE under ``auto``, dense under ``measured``), the floors the bounds rest on checked against the
tables they come from, the book instance re-timed and naming its source, and the bad input of
the ``performance:`` block (one line, exit 2)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import yaml

from optimizer.deployment.perf import PerfModel
from optimizer.model.decode_steps import MeasuredDecode
from optimizer.result import Status
from tests.conftest import INSTANCES, assert_one_line_error, with_changes
from tests.deploy_helpers import assert_solver_equals_brute_force, with_inline_h100_like_gpu
from tests.measured_helpers import random_measured

pytest.importorskip("aiconfigurator_core")

OBJECTIVES = ["cost", "makespan", "energy", "gpus", "dollars", "latency"]
BOOK = INSTANCES / "qwen32b_128k.yaml"


def _measured_book(tmp_path, **extra) -> "Path":
    raw = yaml.safe_load(BOOK.read_text())
    raw["model"]["config"] = str(INSTANCES / raw["model"]["config"])
    raw["performance"] = {"source": "measured", "engine": "vllm"}
    with_changes(raw, **extra)
    path = tmp_path / "book_measured.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("seed", range(16))
def test_moe_auto_equals_brute_force(seed, tmp_path):
    """Qwen3-30B-A3B (MoE) on H100 under ``auto``: every layout the database times is timed by it,
    and the solver's proven optimum equals the exhaustive optimum over the batched decision space."""
    problem = random_measured(seed, tmp_path)
    perf = PerfModel(problem)
    assert isinstance(perf.steps, MeasuredDecode)
    assert all(perf.steps.source_of(lay) == "measured" for lay in problem.layouts)
    assert_solver_equals_brute_force(problem, OBJECTIVES[seed % len(OBJECTIVES)])


@pytest.mark.parametrize("seed", range(100, 106))
def test_dense_measured_equals_brute_force(seed, tmp_path):
    problem = random_measured(seed, tmp_path, model="qwen3-32b", source="measured", deadlines=range(40, 400, 7))
    assert_solver_equals_brute_force(problem, OBJECTIVES[seed % len(OBJECTIVES)])


@pytest.mark.parametrize("seed", range(4))
def test_floors_hold_on_random_active_sets(seed, tmp_path):
    """Every batched step of random active sets (any split over the DP ranks, positions inside the
    instance's range: from the shortest context to the longest context + new) is at least the floor ``g[b] + kv_rate * S / dp`` and the bound LP's
    ``w + kv * S + sigma * (b - 1)``, all read from the same tables the steps are."""
    problem = random_measured(seed, tmp_path)
    perf = PerfModel(problem)
    steps = perf.steps
    rng = np.random.default_rng(seed)
    n = len(problem.sessions)
    top = perf.max_positions
    lo = min(c.context for c in problem.classes)  # no session is decoded before its context
    for lay in problem.layouts:
        floor = steps.decode_step_floor(lay, n, top)
        w, kv = steps.fixed_and_kv_rates(lay, top)
        sigma = steps.session_step_floor(lay, w, n, top)
        assert np.all(np.diff(floor.g) <= 1e-15) or floor.g.size <= 2 or np.all(np.diff(floor.g, 2) <= 1e-12)
        for _ in range(200):
            b = int(rng.integers(1, n + 1))
            pos = rng.integers(lo, top, size=b).astype(float)
            rank = rng.integers(0, lay.attention_dp, size=b)
            t = float(steps.batch_steps_s(lay, pos, 1, rank)[0])
            S = float(np.sum(pos + 1))
            assert t >= floor.g[b] + floor.kv_rate * S / floor.dp - 1e-12
            assert t >= w + kv * S + sigma * (b - 1) - 1e-12


def test_single_session_is_a_batch_of_one(tmp_path):
    problem = random_measured(3, tmp_path)
    steps = PerfModel(problem).steps
    lay = problem.layouts[0]
    pos = np.array([1000.0, 5000.0, 30000.0])
    alone = steps.single_session_step_s(lay, pos)
    assert alone == pytest.approx([float(steps.batch_steps_s(lay, [p], 1)[0]) for p in pos], rel=1e-12)
    assert np.all(np.diff(alone) > 0)  # longer contexts read more KV


def test_book_instance_measured_names_the_source(cli, tmp_path):
    """The book instance re-timed by vLLM's measured kernels: the database's TP2 session takes longer
    than the roofline at peaks (119 ms), so 3 of 4 on time by 130 ms is proven infeasible and the
    output says why and what is achievable; with 2 of 4 required the plan is proven optimal, names
    its source and error band, and times the AllReduce inside the measured step."""
    r = cli(_measured_book(tmp_path), "--objective", "cost")
    assert r.exit_code == 3, r.output
    out = " ".join(r.stdout.split())
    assert "step times: measured kernels" in out and "vllm" in out
    assert "best achievable" in out
    assert "at least 158.967 ms each" in out  # docs/deployment.md: a TP2 session takes 159 ms
    path = _measured_book(tmp_path, workload__min_on_time_fraction=0.5)
    r = cli(path, "--objective", "cost", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["status"] == "optimal" and d["objective"]["gap"] == pytest.approx(0.0, abs=1e-9)
    # docs/deployment.md: two TP4 replicas, 0.728 GPU·s per on-time session, sessions of 91.02 ms
    assert d["objective"]["value"] == pytest.approx(0.728, abs=5e-4)
    assert [i["layout_label"] for i in d["plan"]["instances"]] == ["TP4", "TP4"]
    assert min(s["finish_ms"] for s in d["plan"]["sessions"]) == pytest.approx(91.02, abs=0.005)
    t = d["timing"]
    assert t["source"] == "measured" and "aiconfigurator-core" in t["why"] and t["engine"] == "vllm"
    assert set(t["layouts"].values()) == {"measured"}
    assert 0 < t["error_band"]["finish_time_error"] < 1
    assert all(i["allreduce"]["source"] == "measured" for i in d["plan"]["instances"])
    analytic = json.loads(cli(BOOK, "--objective", "cost", "--format", "json",
                              "--set", "workload.min_on_time_fraction=0.5").stdout)
    assert analytic["timing"]["source"] == "chapter" and analytic["timing"]["error_band"] is not None
    assert d["plan"]["makespan_ms"] > analytic["plan"]["makespan_ms"]
    out = " ".join(cli(path, "--objective", "cost").stdout.split())  # rich wraps at the terminal's width
    assert "step times: measured kernels" in out and "error band: finish times ±" in out
    assert "in the measured step" in out


def test_book_instance_analytic_unchanged(cli):
    r = cli(BOOK, "--objective", "cost")
    assert r.exit_code == 0 and "0.238" in r.stdout
    out = " ".join(r.stdout.split())  # the roofline's figures, and a new user told what timed them
    assert ("step times: the reference chapter's roofline (eq. 6-2) at the catalog's datasheet peaks; error band: "
            "finish times ±42%") in out


@pytest.mark.parametrize("change, needles", [
    ({"hardware__gpu": {"name": "mine", "memory_gb": 80, "memory_bandwidth_gb_s": 3350, "bf16_tflops": 989,
                        "power_w": 700}}, ("performance.source", "no timings for GPU 'mine'")),
    ({"performance__engine_version": "0.0.1"}, ("performance.engine_version", "0.0.1")),
    ({"deployment__micro_batches": 2}, ("deployment.micro_batches", "analytic sources only")),
    ({"deployment__allreduce": "tree"}, ("deployment.allreduce", "analytic sources only")),
    ({"performance__source": "analytic", "performance__memory_fraction": 0.9},
     ("performance.memory_fraction", "measured source only")),
    ({"performance__source": "roofline"}, ("performance.source",)),
    ({"performance__calibration": "nope.yaml"}, ("performance.calibration", "no such calibration file")),
])
def test_bad_performance_block(cli, tmp_path, change, needles):
    raw = yaml.safe_load(_measured_book(tmp_path).read_text())
    if "hardware__gpu" in change:  # an inline GPU needs an inline server
        raw["hardware"]["server"] = {"name": "box", "gpus": 8, "power_kw": 10.0,
                                     "scale_up": {"bandwidth_gb_s": 450.0, "latency_us": 3.0},
                                     "scale_out": {"bandwidth_gb_s": 50.0, "latency_us": 10.0}}
    with_changes(raw, **change)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert_one_line_error(cli(path), str(path), *needles)


def test_auto_on_an_uncovered_gpu_falls_back_and_says_so(cli, tmp_path):
    raw = yaml.safe_load(_measured_book(tmp_path).read_text())
    raw["performance"] = {"source": "auto"}
    with_inline_h100_like_gpu(raw)
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(raw))
    r = cli(path, "--objective", "cost", "--format", "json")
    assert r.exit_code in (0, 3), r.output
    assert "auto: timed by the analytic roofline" in r.stderr
    d = json.loads(r.stdout)
    assert d["timing"]["source"] == "analytic" and "measured database" in d["timing"]["why"]
    assert d["timing"]["error_band"] is None  # an inline GPU has no measured runs


def test_calibrated_source_scales_steps_and_keeps_floors(tmp_path):
    """A calibration file (decode factor 1.2, 0.5 ms per step) on the measured source: every step
    is ``1.2 t + 0.5 ms`` of the uncalibrated one, the floors still hold on random active sets, and
    the result says it is calibrated."""
    from dataclasses import replace

    from optimizer.deployment.strategy import solve_deployment
    from optimizer.model.decode_steps import CalibratedDecode

    cal = tmp_path / "cal.yaml"
    cal.write_text("calibration: {source: measured, prefill: 1.0, decode: 1.2, overhead_ms: 0.5}\n")
    from optimizer.model.steptimes import read_calibration

    base = random_measured(5, tmp_path, source="measured")
    problem = replace(base, performance=replace(base.performance,
                                                   calibration=read_calibration(cal, tmp_path / "x.yaml")))
    plain, calibrated = PerfModel(base).steps, PerfModel(problem).steps
    assert isinstance(calibrated, CalibratedDecode) and "calibrated" in calibrated.why
    rng = np.random.default_rng(5)
    top = PerfModel(problem).max_positions
    lo = min(c.context for c in problem.classes)
    n = len(problem.sessions)
    for lay in problem.layouts:
        pos = rng.integers(lo, top, size=min(n, 3)).astype(float)
        assert calibrated.batch_steps_s(lay, pos, 4) == pytest.approx(1.2 * plain.batch_steps_s(lay, pos, 4) + 5e-4,
                                                                      rel=1e-12)
        floor = calibrated.decode_step_floor(lay, n, top)
        w, kv = calibrated.fixed_and_kv_rates(lay, top)
        sigma = calibrated.session_step_floor(lay, w, n, top)
        for _ in range(100):
            b = int(rng.integers(1, n + 1))
            p = rng.integers(lo, top, size=b).astype(float)
            t = float(calibrated.batch_steps_s(lay, p, 1, rng.integers(0, lay.attention_dp, size=b))[0])
            S = float(np.sum(p + 1))
            assert t >= floor.g[b] + floor.kv_rate * S / floor.dp - 1e-12
            assert t >= w + kv * S + sigma * (b - 1) - 1e-12
    out = solve_deployment(problem, "makespan", time_limit_s=60)
    assert out.status in (Status.OPTIMAL, Status.INFEASIBLE)
    if out.status == Status.OPTIMAL:
        assert out.evaluation.violations == []


@pytest.mark.parametrize("system, factor", [("h100_sxm", 1.3), ("b200_sxm", 1.0)])
def test_calibration_groups_pick_the_gpu_and_engine(tmp_path, system, factor):
    """A calibration file's ``groups`` (written by ``optimize calibrate`` per GPU and engine): the
    instance's (GPU system, engine) group applies; another GPU's group leaves the prior (1, 1, 0)."""
    from dataclasses import replace

    from optimizer.model.steptimes import read_calibration

    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"calibration": {
        "source": "measured", "prefill": 1.0, "decode": 1.0, "overhead_ms": 0.0, "models": ["qwen3-30b-a3b"],
        "groups": [{"gpu_system": system, "engine": "vllm", "prefill": 1.0, "decode": 1.3, "overhead_ms": 0.0}]}}))
    base = random_measured(7, tmp_path, source="measured")
    problem = replace(base, performance=replace(base.performance, calibration=read_calibration(cal, tmp_path / "x.yaml")))
    lay = problem.layouts[0]
    pos = np.array([2000.0, 9000.0])
    plain = PerfModel(base).steps.batch_steps_s(lay, pos, 3)
    assert PerfModel(problem).steps.batch_steps_s(lay, pos, 3) == pytest.approx(factor * plain, rel=1e-12)


def test_bad_calibration_groups_one_line(cli, tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text("calibration: {source: measured, prefill: 1, decode: 1, overhead_ms: 0, "
                   "groups: [{gpu_system: h100_sxm, engine: vllm, prefill: 1, decode: -2, overhead_ms: 0}]}\n")
    path = _measured_book(tmp_path, performance__calibration=str(cal))
    assert_one_line_error(cli(path), str(cal), "calibration.groups", "positive")


def test_default_source_is_auto_and_measured_where_the_database_covers(cli, tmp_path):
    """The book instance without its ``performance:`` pin: the default (auto) times it by the
    measured kernels, so its answer is the measured one (3 of 4 on time is out of reach)."""
    raw = yaml.safe_load(BOOK.read_text())
    raw["model"]["config"] = str(INSTANCES / raw["model"]["config"])
    del raw["performance"]
    path = tmp_path / "book_default.yaml"
    path.write_text(yaml.safe_dump(raw))
    default = cli(path, "--objective", "cost", "--format", "json")
    measured = cli(_measured_book(tmp_path), "--objective", "cost", "--format", "json")
    assert default.exit_code == measured.exit_code == 3
    d, m = json.loads(default.stdout), json.loads(measured.stdout)
    assert d["timing"]["source"] == "measured" and d["status"] == m["status"] == "infeasible"


@pytest.mark.parametrize("gpu, server, basis", [("h100-sxm", "hgx-h100", "fitted to aiconfigurator-core"),
                                                ("h800-sxm", "hgx-h800", "carried from the hopper GPUs")])
def test_analytic_source_runs_the_roofline_on_fitted_peaks(cli, tmp_path, gpu, server, basis):
    """``source: analytic`` is the roofline on achieved peaks (instances/hardware/efficiency.yaml):
    every session finishes later than under ``chapter`` (the peaks), by at most 1 / min(share);
    a GPU the database lacks takes its generation's shares and says so."""
    from optimizer.model.efficiency import fitted_efficiency

    raw = yaml.safe_load(BOOK.read_text())
    raw["model"]["config"] = str(INSTANCES / raw["model"]["config"])
    with_changes(raw, hardware__gpu=gpu, hardware__server=server, workload__min_on_time_fraction=0.0)
    got = {}
    for source in ("chapter", "analytic"):
        raw["performance"] = {"source": source}
        path = tmp_path / f"{source}.yaml"
        path.write_text(yaml.safe_dump(raw))
        r = cli(path, "--objective", "makespan", "--format", "json")
        assert r.exit_code == 0, r.output
        got[source] = json.loads(r.stdout)
    t = got["analytic"]["timing"]
    assert t["source"] == "analytic" and basis in t["why"] and "achieved peaks" in t["why"]
    f = fitted_efficiency(gpu, "vllm")
    lo, hi = got["chapter"]["plan"]["makespan_ms"], got["analytic"]["plan"]["makespan_ms"]
    assert lo < hi <= lo / min(f.compute, f.memory, f.network) * (1 + 1e-6)


def test_auto_times_two_micro_batches_by_the_fitted_roofline_and_warns(cli, tmp_path):
    raw = yaml.safe_load(BOOK.read_text())
    raw["model"]["config"] = str(INSTANCES / raw["model"]["config"])
    raw["performance"] = {"source": "auto"}
    with_changes(raw, deployment__micro_batches=2, workload__min_on_time_fraction=0.0)
    path = tmp_path / "tbo.yaml"
    path.write_text(yaml.safe_dump(raw))
    r = cli(path, "--objective", "cost", "--format", "json")
    assert r.exit_code == 0, r.output
    assert "deployment.micro_batches" in r.stderr and "fitted peaks" in r.stderr
    assert json.loads(r.stdout)["timing"]["source"] == "analytic"
