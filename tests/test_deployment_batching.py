"""Layouts and batched decode in the deployment problem: the issue's acceptance case, the
vectorised step table against the shared model, bad layout input (exit 2), refusals, and a
brute-force property test over assignments, layouts (incl. PP and DP attention) and batch limits."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import yaml

from optimizer.deployment.api import load, solve
from optimizer.deployment.batching import admission_order, batch_limits
from optimizer.deployment.evaluate import Plan, PlannedInstance, evaluate
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import build_problem
from optimizer.deployment.solver import solve_deployment
from optimizer.deployment.units import ticks_up
from optimizer.model.layout import Layout
from optimizer.model.perf import batch_step_table
from optimizer.result import Status
from tests.conftest import INSTANCES, assert_one_line_error
from tests.deploy_helpers import write_tiny_config

MOE = INSTANCES / "qwen3_30b_a3b_batched.yaml"


def eight_sessions(tmp_path, **deployment):
    raw = {"name": "eight 8K sessions", "model": {"config": str(INSTANCES / "models" / "qwen3-32b.json")},
           "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": 1},
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


def test_batched_faults_and_latency_are_refused(cli):
    assert_one_line_error(cli(MOE, "--set", "faults=[{at_ms: 20, stall_ms: 40}]"), "deployment.max_batch", "faults")
    assert_one_line_error(cli(MOE, "--objective", "latency"), "deployment.max_batch", "latency")


def test_moe_instance_is_proven_optimal():
    out = solve_deployment(load(MOE), "cost", time_limit_s=60)
    assert out.status == Status.OPTIMAL and out.stats.gap == 0.0
    assert out.evaluation.violations == [] and out.evaluation.nominal.on_time == 16


# ---------------------------------------------------------------------------- brute force


def random_batched(seed: int, folder, deadlines=range(30, 300, 7)):
    rng = random.Random(seed)
    cfg = write_tiny_config(folder)
    gpus, servers = rng.choice([(2, 1), (4, 1), (2, 2)])
    sessions, total = [], 0
    for g in range(rng.randint(1, 2)):
        count = min(rng.randint(1, 3), 4 - total)
        if count <= 0:
            break
        total += count
        sessions.append({"name": f"g{g}", "count": count, "context_tokens": rng.randrange(5_000, 60_000, 1000),
                         "new_tokens": rng.randint(2, 6), "deadline_ms": rng.choice([None, *deadlines])})
    layouts = [{"attention": {"tp": 1}}, {"attention": {"tp": 2}}, {"attention": {"tp": 1}, "pp": 2},
               {"attention": {"tp": 1, "dp": 2}}]
    raw = {
        "name": f"batched {seed}", "model": {"config": str(cfg)},
        "hardware": {
            "gpu": {"name": "small", "memory_gb": rng.choice([0.2, 0.3, 0.5]), "memory_bandwidth_gb_s": 10.0,
                    "bf16_tflops": 50.0, "power_w": 300.0, "dollars_per_gpu_hour": 2.5},
            "server": {"name": "box", "gpus": gpus, "power_kw": 2.0,
                       "scale_up": {"bandwidth_gb_s": 50.0, "latency_us": 20.0},
                       "scale_out": {"bandwidth_gb_s": 5.0, "latency_us": 60.0}},
            "servers": servers},
        "workload": {"sessions": sessions, "min_on_time_fraction": rng.choice([0.0, 0.5, 1.0])},
        "deployment": {"reserve_gib_per_gpu": 0.01, "layouts": rng.sample(layouts, rng.randint(1, 4)),
                       "max_batch": rng.choice([2, 3, None])},
    }
    return build_problem(raw, folder / "batched.yaml")


def _place(problem, lays):
    """First-fit GPU ids for instances of these layouts (spanning ones on whole servers), or None."""
    G = problem.server.gpus
    free = {s: list(range(s * G, (s + 1) * G)) for s in range(problem.servers)}
    out = []
    for lay in sorted(lays, key=lambda l: -l.gpus):
        if lay.gpus > G:
            m = lay.gpus // G
            srv = [s for s in free if len(free[s]) == G][:m]
            if len(srv) < m:
                return None
            out.append((lay, tuple(srv), tuple(g for s in srv for g in free.pop(s))))
        else:
            s = next((s for s in free if len(free[s]) >= lay.gpus), None)
            if s is None:
                return None
            out.append((lay, (s,), tuple(free[s][:lay.gpus])))
            free[s] = free[s][lay.gpus:]
    return out


def brute_force_batched(problem, objective, most_on_time: bool = False):
    """Every multiset of instances (allowed layouts), assignment of sessions, batch limit per
    instance (1, powers of two, its session count; capped by max_batch) and admission order
    (every permutation at batch 1; earliest deadline first above), each plan re-checked by
    the independent evaluator."""
    from objectives.deployment import get
    perf = PerfModel(problem)
    obj = get(objective)
    by_id = {s.id: s for s in problem.sessions}
    ids = [s.id for s in problem.sessions]
    need = max(problem.required_on_time, obj.min_on_time)
    best = None
    most = None  # most sessions on time over valid plans, ignoring the requirement
    lays = [l for l in problem.layouts if l.gpus <= problem.total_gpus]
    for k in range(1, len(ids) + 1):
        for combo in itertools.combinations_with_replacement(lays, k):
            placed = _place(problem, combo)
            if placed is None:
                continue
            for assign in itertools.product(range(k), repeat=len(ids)):
                groups = [[sid for sid, a in zip(ids, assign) if a == i] for i in range(k)]
                if any(not g for g in groups):
                    continue
                choices = []
                for (lay, _, _), g in zip(placed, groups):
                    opts = []
                    for b in batch_limits(len(g), problem.batch_cap):
                        if b == 1:
                            opts += [(1, list(o)) for o in itertools.permutations(g)]
                        else:
                            jobs = [(by_id[s].context, by_id[s].new, by_id[s].deadline_s) for s in g]
                            opts.append((b, [g[i] for i in admission_order(jobs, [0] * len(g), b)]))
                    choices.append(opts)
                for pick in itertools.product(*choices):
                    plan = Plan([PlannedInstance(f"i{i}", lay.gpus, srv, gl, order, lay, b)
                                 for i, ((lay, srv, gl), (b, order)) in enumerate(zip(placed, pick))])
                    ev = evaluate(problem, plan, perf)
                    if ev.violations:
                        continue
                    most = ev.nominal.on_time if most is None else max(most, ev.nominal.on_time)
                    if ev.nominal.on_time < need:
                        continue
                    v = obj.value(ev)
                    if best is None or v < best - 1e-12:
                        best = v
    return most if most_on_time else best


BATCHED_OBJECTIVES = ["cost", "makespan", "energy", "gpus", "dollars"]


@pytest.mark.parametrize("seed", range(20))
def test_batched_solver_equals_brute_force(seed, tmp_path):
    problem = random_batched(seed, tmp_path)
    objective = BATCHED_OBJECTIVES[seed % len(BATCHED_OBJECTIVES)]
    best = brute_force_batched(problem, objective)
    out = solve_deployment(problem, objective, time_limit_s=60)
    if best is None:
        assert out.status == Status.INFEASIBLE
        return
    assert out.status == Status.OPTIMAL, out.notes
    assert out.evaluation.violations == []
    # the search counts time in 10 ns ticks (rounded up): equal to the brute force within that
    assert out.value == pytest.approx(best, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("seed", range(16, 24))
def test_most_on_time_equals_brute_force(seed, tmp_path):
    """The infeasibility explanation's 'at most k on time' is the brute-force maximum."""
    from optimizer.deployment.batching import max_on_time_batched
    from dataclasses import replace
    problem = replace(random_batched(seed, tmp_path, deadlines=range(15, 90, 3)), min_on_time_fraction=0.0)
    assert max_on_time_batched(problem, PerfModel(problem), 30) == brute_force_batched(problem, "cost", most_on_time=True)


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
