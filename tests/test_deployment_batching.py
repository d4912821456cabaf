"""Layouts and batched decode in the deployment problem: the issue's acceptance case, the
vectorised step table against the shared model, bad layout input (exit 2), refusals, the
max_batch 1 equivalence with the TP-only search. The brute-force property tests over layouts and
batch limits are in test_deployment_bruteforce.py."""
from __future__ import annotations


import numpy as np
import pytest
import yaml

from optimizer.deployment.api import load, solve
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.strategy import solve_deployment
from optimizer.deployment.units import ticks_up
from optimizer.model.layout import Layout
from optimizer.model.perf import batch_step_table
from optimizer.result import Status
from tests.conftest import INSTANCES, assert_one_line_error

MOE = INSTANCES / "qwen3_30b_a3b_batched.yaml"


def eight_sessions(tmp_path, **deployment):
    raw = {"name": "eight 8K sessions", "model": {"config": str(INSTANCES / "models" / "qwen3-32b.json")},
           "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": 1},
           "performance": {"source": "chapter"},
           "workload": {"sessions": [{"name": "chat", "count": 8, "context_tokens": 8192, "new_tokens": 256,
                                      "deadline_ms": 5000}]},
           "deployment": deployment}
    p = tmp_path / "eight.yaml"
    p.write_text(yaml.safe_dump(raw))
    return load(p)


def test_eight_8k_sessions_on_one_hgx_h100_are_on_time(tmp_path):
    """The issue's case: 8 x 8K-context Qwen3-32B sessions, 256 new tokens, 5 s deadline."""
    rep = solve(eight_sessions(tmp_path), "cost", explain=False)
    assert rep.status == Status.OPTIMAL
    ev = rep.outcome.evaluation
    assert ev.violations == []
    assert ev.nominal.on_time == 8
    assert max(t.finish_s for t in ev.nominal.sessions) < 5.0
    assert any(inst.max_batch > 1 for inst in ev.plan.instances)
    # one session at a time (the old behaviour) cannot do it
    old = solve(eight_sessions(tmp_path, max_batch=1), "cost", explain=False)
    assert old.status == Status.INFEASIBLE


def test_json_names_layout_and_batch(tmp_path):
    d = solve(eight_sessions(tmp_path), "cost", time_limit_s=20).to_dict()
    inst = d["plan"]["instances"][0]
    assert set(inst["layout"]) == {"attention", "experts", "pp"}
    assert inst["max_batch"] >= 1 and inst["gpu_count"] == len(inst["gpus"])
    assert {a["option"] for a in d["alternatives"]} == {"TP1", "TP2", "TP4", "TP8"}


@pytest.mark.parametrize("lay", [Layout.tp(8), Layout.tp(2), Layout(2, 4, 2, 4, 1), Layout(1, 8, 1, 8, 1),
                                 Layout(4, 2, 8, 1, 1), Layout(2, 2, 2, 2, 2)])
def test_step_table_equals_the_shared_model(lay):
    perf = PerfModel(load(MOE)).model
    rng = np.random.default_rng(1)
    pos = rng.integers(100, 20000, size=5)
    rank = np.arange(5) % lay.attention_dp
    got = batch_step_table(perf).step_times_s(lay, pos, 4, rank=rank)
    want = [perf.step_time_s(lay, pos + j, rank=rank) for j in range(4)]
    assert got == pytest.approx(want, rel=1e-10)


def test_one_active_session_matches_the_single_session_time():
    perf = PerfModel(load(MOE)).model
    lay = Layout(2, 4, 2, 4, 1)
    assert perf.step_time_s(lay, [5000]) == pytest.approx(float(perf.single_session_step_s(lay, [5000])[0]), rel=1e-12)


@pytest.mark.parametrize("layout,field", [
    ("{attention: {tp: 1, dp: 3}, experts: {tp: 1, ep: 3}}", "deployment.layouts[0].experts.ep"),
    ("{attention: {tp: 2, dp: 2}, experts: {tp: 1, ep: 4}, gpus: 8}", "deployment.layouts[0].gpus"),
    ("{attention: {tp: 2, dp: 2}, experts: {tp: 1, ep: 2}}", "deployment.layouts[0].experts"),
    ("{attention: {tp: 1}, pp: 64}", "deployment.layouts[0].pp"),
])
def test_bad_layouts_exit_2_naming_the_field(cli, layout, field):
    assert_one_line_error(cli(MOE, "--set", f"deployment.layouts=[{layout}]"), field)


def test_layouts_and_tensor_parallel_together_or_experts_on_a_dense_model_are_bad_input(cli):
    book = INSTANCES / "qwen32b_128k.yaml"  # has tensor_parallel
    assert_one_line_error(cli(book, "--set", "deployment.layouts=[{attention: {tp: 2}}]"), "deployment.layouts",
                          "tensor_parallel")
    assert_one_line_error(cli(INSTANCES / "qwen32b_batched_8k.yaml", "--set",
                              "deployment.layouts=[{attention: {tp: 2}, experts: {tp: 1, ep: 2}}]"),
                          "deployment.layouts[0].experts", "dense")


def test_batched_faults_are_refused(cli):
    assert_one_line_error(cli(MOE, "--set", "faults=[{at_ms: 20, stall_ms: 40}]"), "deployment.max_batch", "faults")


def test_batched_latency_is_the_mean_simulated_finish():
    """Latency with batching: the columns carry the sum of their sessions' simulated finish times;
    the plan's value is the evaluator's mean finish time, proven optimal over the search space."""
    out = solve_deployment(load(MOE), "latency", time_limit_s=60)
    assert out.status == Status.OPTIMAL and out.evaluation.violations == []
    finishes = [t.finish_s for t in out.evaluation.nominal.sessions]
    assert out.value == pytest.approx(1e3 * sum(finishes) / len(finishes), rel=1e-12)
    assert out.bound == pytest.approx(out.value, rel=1e-6)


def test_moe_instance_is_proven_optimal():
    out = solve_deployment(load(MOE), "cost", time_limit_s=60)
    assert out.status == Status.OPTIMAL and out.stats.gap == 0.0
    assert out.evaluation.violations == [] and out.evaluation.nominal.on_time == 16


def test_infeasible_batched_reports_the_batched_maximum(tmp_path):
    rep = solve(_tight(tmp_path), "cost", time_limit_s=30)
    assert rep.status == Status.INFEASIBLE
    assert rep.achievable["requirement"] == "on_time" and 0 < rep.achievable["best"] < 8
    assert any(k.family == "on_time" for k in rep.conflict_keys)


def _tight(tmp_path):
    p = eight_sessions(tmp_path)
    from dataclasses import replace
    classes = tuple(replace(c, deadline_s=1.1) for c in p.classes)
    sessions = tuple(replace(s, deadline_s=1.1) for s in p.sessions)
    return replace(p, classes=classes, sessions=sessions)


def test_configuration_load_matches_the_evaluator(tmp_path):
    """The search's event-by-event timeline equals the evaluator's step-by-step one (to a tick)."""
    problem = eight_sessions(tmp_path)
    out = solve_deployment(problem, "cost", time_limit_s=30)
    perf = PerfModel(problem)
    from optimizer.deployment.batching import simulate
    for inst in out.evaluation.plan.instances:
        jobs = [(problem.sessions[0].context, problem.sessions[0].new)] * len(inst.sessions)
        _, fin = simulate(perf, inst.lay, jobs, inst.max_batch)
        got = max(t.finish_s for t in out.evaluation.nominal.sessions if t.instance == inst.id)
        assert ticks_up(max(fin)) == pytest.approx(ticks_up(got), abs=1)


@pytest.mark.parametrize("name", ["qwen32b_128k.yaml", "qwen32b_two_servers.yaml", "llama8b_mixed_h200.yaml"])
@pytest.mark.parametrize("objective", ["cost", "makespan"])
def test_batch_limit_one_reproduces_the_tp_only_optimum(name, objective):
    """With max_batch 1 the layouts/batched search over the same TP layouts finds the TP-only
    optimum (same value to 1e-9): one active session steps exactly as before."""
    import time as _time

    from optimizer.deployment.exact import solve_batched
    problem = load(INSTANCES / name)
    assert problem.tp_only and problem.max_batch == 1
    legacy = solve_deployment(problem, objective, time_limit_s=60)
    perf = PerfModel(problem)
    batched = solve_batched(problem, perf, legacy.objective, _time.perf_counter() + 60,
                             tuple(Layout.tp(p) for p in problem.degrees))
    assert legacy.status == batched.status == Status.OPTIMAL
    assert batched.evaluation.violations == []
    assert batched.value == pytest.approx(legacy.value, rel=1e-9)


# ---------------------------------------------------------------------------- shipped instances
LAYOUT_INSTANCES = {
    # name: (cost GPU·s per on-time session, layouts of the plan)
    "qwen32b_batched_8k.yaml": (1.1652, ["TP8"]),
    "qwen3_30b_a3b_batched.yaml": (0.30443, ["TP4", "TP2", "TP2"]),
    "qwen3_235b_hgx_h100.yaml": (1.8808, ["TP8"]),
    "deepseek_v3_two_h200.yaml": (2.6958, ["TP1xDP16/EP16"]),
}


@pytest.mark.parametrize("name", sorted(LAYOUT_INSTANCES))
def test_layout_instances(name):
    """Golden values of the layout / batched instances (model of optimizer.model, 1e-4 relative),
    each proven optimal; the plan never loses to any layout alone and passes the evaluator."""
    text = (INSTANCES / name).read_text()
    assert text.startswith("#") and "Sources:" in text
    problem = load(INSTANCES / name)
    r = solve(problem, "cost", time_limit_s=60)
    assert r.status == Status.OPTIMAL and r.outcome.stats.gap == 0.0
    ev = r.outcome.evaluation
    assert ev.violations == [] and ev.nominal.on_time == len(problem.sessions)
    value, labels = LAYOUT_INSTANCES[name]
    assert r.outcome.value == pytest.approx(value, rel=1e-4)
    assert sorted(i.lay.label() for i in ev.plan.instances) == sorted(labels)
    others = [a.value for a in r.alternatives if a.value is not None]
    assert others and r.outcome.value <= min(others) * (1 + 1e-9)
    assert {a.option for a in r.alternatives} == {lay.label() for lay in problem.layouts}
