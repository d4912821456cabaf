"""Anytime solving at scale (``optimizer/deployment/anytime.py``): bounds never above brute-force
optima, constructive plans that pass the evaluator, rounded instances whose plans stay feasible,
and a run cut by its time limit that still prints a plan, a bound and a gap."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.scale_helpers import generate_mixed
from objectives.deployment import get
from optimizer.deployment.anytime import Anytime, BoundLP, bound_in_unit, rounded_problem
from optimizer.deployment.evaluate import evaluate
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import build_problem
from optimizer.deployment.settings import AnytimeSettings
from optimizer.deployment.exact import solve_exact
from optimizer.deployment.strategy import solve_deployment
from optimizer.model.layout import Layout
from optimizer.result import Status
from tests.deploy_helpers import brute_force, brute_force_batched, random_batched
from tests.test_deployment_bruteforce import random_instance

ROOT = Path(__file__).resolve().parents[1]
BOUND_OBJECTIVES = ["cost", "makespan", "energy"]


def _kinds_layouts(problem):
    return [Layout.tp(p) for p in problem.degrees] if problem.tp_only else list(problem.layouts)


def _lp_bound(problem, objective):
    perf = PerfModel(problem)
    obj = get(objective)
    a = Anytime(problem, perf, obj, _kinds_layouts(problem))
    if not a.kinds:
        return None
    lp = BoundLP(problem, perf, a.kinds)
    b, _ = bound_in_unit(problem, obj, lp, None, time.perf_counter() + 30)
    return b


@pytest.mark.parametrize("seed", range(40))
def test_lp_bound_never_above_brute_force_optimum(seed, tmp_path):
    """One session at a time (TP degrees, no faults): the LP bound ≤ the exhaustive optimum."""
    problem = random_instance(seed, tmp_path)
    problem = replace(problem, faults=())
    objective = BOUND_OBJECTIVES[seed % len(BOUND_OBJECTIVES)]
    best, _ = brute_force(problem, objective)
    b = _lp_bound(problem, objective)
    if best is None or b is None:
        return
    assert b <= best * (1 + 1e-9) + 1e-12, (b, best)


@pytest.mark.parametrize("seed", range(30))
def test_lp_bound_never_above_batched_brute_force(seed, tmp_path):
    """Layouts and batched decode: the LP bound ≤ the exhaustive optimum of the search space."""
    problem = random_batched(seed, tmp_path)
    objective = BOUND_OBJECTIVES[seed % len(BOUND_OBJECTIVES)]
    best = brute_force_batched(problem, objective)
    b = _lp_bound(problem, objective)
    if best is None or b is None:
        return
    assert b <= best * (1 + 1e-9) + 1e-12, (b, best)


@pytest.mark.parametrize("objective", ["gpus", "dollars"])
@pytest.mark.parametrize("seed", range(12))
def test_gpus_and_dollars_bounds_never_above_brute_force(seed, objective, tmp_path):
    """The fewest GPUs with which the LP reaches the on-time requirement at any makespan, and
    the least GPU time per on-time session (priced): ≤ the exhaustive optimum, one session at
    a time and batched; and given whenever a plan exists (a fresh user saw bound 0, gap 100 %)."""
    for problem, best in ((replace(random_instance(seed, tmp_path), faults=()), None),
                          (random_batched(seed, tmp_path), None)):
        best = brute_force(problem, objective)[0] if problem.tp_only else brute_force_batched(problem, objective)
        b = _lp_bound(problem, objective)
        if best is None:
            continue
        assert b is not None and b > 0
        assert b <= best * (1 + 1e-9) + 1e-12, (b, best)
        if objective == "gpus":
            assert b == int(b)


@pytest.mark.parametrize("max_batch", [1, None])
def test_gpus_objective_at_scale_has_a_bound_and_beats_list_scheduling(tmp_path, max_batch):
    """200 distinct sessions, --objective gpus: a fresh user got the list-scheduling plan (all
    128 GPUs one at a time) with bound 0 and gap 100 %. Now the LP gives the fewest GPUs any
    plan needs and the fewest-GPU bisection finds plans below the list-scheduling one; the plan
    passes the evaluator (inside the solve) and the bound stays below it."""
    from optimizer.deployment.anytime_solve import fewest_gpus

    path = _mixed(tmp_path, max_batch=max_batch)
    problem = build_problem(yaml.safe_load(path.read_text()), path)
    obj = get("gpus")
    perf = PerfModel(problem)
    a = Anytime(problem, perf, obj, _kinds_layouts(problem))
    first = a.score(a.construct(time.perf_counter() + 2))
    lp = BoundLP(problem, perf, a.kinds)
    b, _ = bound_in_unit(problem, obj, lp, None, time.perf_counter() + 30)
    assert b is not None and 0 < b <= first
    plans = fewest_gpus(a, lp, int(b), int(first), time.perf_counter() + 30)
    assert plans and all(b <= a.score(p) < first for p in plans)
    out = solve_deployment(problem, "gpus", time_limit_s=6)
    assert out.status in (Status.FEASIBLE, Status.OPTIMAL) and out.evaluation.violations == []
    # (the solve's own bound and plan under its 10 s limit may stop short of the 30 s side
    # computations above on a loaded machine: bound 41 vs 42 GPUs, plan 78 vs 56; quality at a
    # given time is a benchmark figure)
    assert out.bound is not None and 0 < out.bound <= out.value <= first


@pytest.mark.parametrize("seed", range(24))
def test_constructive_plan_passes_evaluator_and_is_no_better_than_optimum(seed, tmp_path):
    problem = replace(random_instance(seed, tmp_path), faults=())
    objective = BOUND_OBJECTIVES[seed % len(BOUND_OBJECTIVES)]
    best, _ = brute_force(problem, objective)
    perf = PerfModel(problem)
    a = Anytime(problem, perf, get(objective), _kinds_layouts(problem))
    sol = a.construct(time.perf_counter() + 5) if a.kinds else None
    if sol is None or math.isinf(a.score(sol)):
        return
    sol = a.improve(sol, time.perf_counter() + 2)
    ev = evaluate(problem, a.plan(sol), perf)
    assert ev.violations == []
    value = get(objective).value(ev)
    assert value == pytest.approx(a.score(sol), rel=1e-9)  # the internal score is the evaluator's
    assert best is not None and value >= best * (1 - 1e-9)


@pytest.mark.parametrize("seed", range(12))
def test_rounded_instance_plan_is_feasible_for_the_real_one(seed, tmp_path):
    """Lengths rounded up, deadlines down: the rounded instance's optimal plan passes the
    evaluator on the real instance with at least as many sessions on time."""
    problem = replace(random_instance(seed, tmp_path), faults=(), min_on_time_fraction=0.0)
    rp = rounded_problem(problem, (1, 1, 1))
    assert len(rp.classes) <= 2  # one length class (with and without deadline)
    assert {s.id for s in rp.sessions} == {s.id for s in problem.sessions}
    for s, r in zip(problem.sessions, rp.sessions):
        assert r.context >= s.context and r.new >= s.new
        assert (s.deadline_s is None) == (r.deadline_s is None)
        assert s.deadline_s is None or r.deadline_s <= s.deadline_s
    out = solve_exact(rp, get("makespan"), time.perf_counter() + 30)
    if out.evaluation is None:
        return
    ev = evaluate(problem, out.evaluation.plan)
    assert ev.violations == []
    assert ev.nominal.on_time >= out.evaluation.nominal.on_time
    assert ev.nominal.makespan_s <= out.evaluation.nominal.makespan_s * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_dealt_plan_places_every_session_once_within_memory(seed, tmp_path):
    """Anytime.deal (the first plans above DEAL_SESSIONS sessions; a fresh user's 500,000
    sessions got no plan in 20 s from the greedy): each session placed once, the plan
    passing the evaluator, one at a time and batched; construct_many uses it when the
    threshold is lowered."""
    from optimizer.deployment import anytime as at

    problem, perf, a = _random_anytime(seed, tmp_path)
    dealt = 0
    for mix in a.single_kind_mixes():
        (k, n), = mix.items()
        sol = a.deal(mix)
        if sol is None:  # memory full before every session is placed
            continue
        dealt += 1
        assert sorted(i for it in sol for i in it.sessions) == list(range(len(problem.sessions)))
        if len(problem.classes) == 1 and a.kinds[k].fits.all() and len(sol) == n:  # one class: even, in turn
            sizes = sorted(len(it.sessions) for it in sol)
            assert sizes[-1] - sizes[0] <= 1
        assert evaluate(problem, a.plan(sol), perf).violations == []
    old = at.DEAL_SESSIONS
    at.DEAL_SESSIONS = 0
    try:
        got = a.construct_many(time.perf_counter() + 5)
    finally:
        at.DEAL_SESSIONS = old
    if dealt:
        assert got and all(evaluate(problem, a.plan(s), perf).violations == [] for s in got[:3])


def _mixed(tmp_path, n=200, servers=16, max_batch=1, seed=0):
    raw = generate_mixed(n, servers, seed=seed, max_batch=max_batch)
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("max_batch", [1, None])
def test_time_limited_run_prints_plan_bound_and_gap(tmp_path, max_batch, cli):
    """200 distinct sessions, --time-limit 5: a feasible plan with its bound and gap in the JSON
    envelope; the plan passes the evaluator."""
    path = _mixed(tmp_path, max_batch=max_batch)
    res = cli(path, "--time-limit", "5", "--format", "json")  # in-process: the limit counts from the command's start (tests/conftest.py); in a fresh process on the loaded 2-core machine start-up alone took 5-6 s
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["status"] == "feasible"
    o = d["objective"]
    assert o["value"] is not None and o["bound"] is not None and o["gap"] is not None
    assert 0 < o["bound"] <= o["value"]
    assert o["gap"] == pytest.approx((o["value"] - o["bound"]) / o["value"], rel=1e-6)
    # the command's wall time against its limit: benchmarks/bench_deployment.py --limits
    # re-check the printed plan with the evaluator
    problem = build_problem(yaml.safe_load(path.read_text()), path)
    from optimizer.deployment.evaluate import Plan, PlannedInstance
    insts = []
    for i in d["plan"]["instances"]:
        layout = None
        if max_batch is None:
            layout = next(lay for lay in problem.layouts if lay.label() == i["layout_label"])
        insts.append(PlannedInstance(i["id"], i["gpu_count"], tuple(i["servers"]), tuple(i["gpus"]), i["sessions"],
                                     layout, i["max_batch"]))
    ev = evaluate(problem, Plan(insts))
    assert ev.violations == []
    assert get("cost").value(ev) == pytest.approx(o["value"], rel=1e-9)


def test_solve_api_states_how_the_plan_was_found(tmp_path):
    path = _mixed(tmp_path, n=60, servers=4)
    problem = build_problem(yaml.safe_load(path.read_text()), path)
    out = solve_deployment(problem, "cost", time_limit_s=4)
    assert out.status in (Status.FEASIBLE, Status.OPTIMAL)
    assert out.evaluation.violations == []
    assert out.mode.startswith("anytime")
    assert any("classes by exact equality" in n for n in out.notes)
    assert out.bound is not None and out.bound <= out.value


def test_progress_table_on_stderr_keeps_json_clean(tmp_path, cli):
    path = _mixed(tmp_path, n=40, servers=4)
    res = cli(path, "--time-limit", "3", "--format", "json", "--progress")  # in-process: the limit counts from the command's start (tests/conftest.py); in a fresh process on the loaded 2-core machine start-up alone took 5-6 s
    assert res.exit_code == 0, res.stderr
    json.loads(res.stdout)
    assert "incumbent" in res.stderr and "bound" in res.stderr and "constructive plan" in res.stderr


@pytest.mark.parametrize("servers,fraction,family", [(1, 0.8, "memory"), (16, 1.0, "on_time")])
def test_large_infeasible_instance_is_explained_by_the_lp(tmp_path, servers, fraction, family):
    """Too many sessions for one server's memory, or every session on time: proven infeasible by
    the LP relaxation (exit 3), the conflict named, without building the compact model."""
    raw = generate_mixed(200, servers, seed=1, fraction=fraction, max_batch=1)
    path = tmp_path / "infeasible.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    problem = build_problem(raw, path)
    from optimizer.deployment.api import solve
    r = solve(problem, "cost", time_limit_s=10)
    if family == "on_time" and r.status == Status.TIME_LIMIT:
        # the LP allows all 200 on time, list scheduling finds no such plan: said so, no plan claimed
        assert r.outcome.value is None and any("LP relaxation allows" in n for n in r.outcome.notes)
        # each comparison row is ruled out by memory or the LP's on-time proof, or honestly
        # undecided when the repair used the time (under load)
        assert all(a.reason in ("memory", "deadline", "time_limit") for a in r.alternatives), \
            [(a.option, a.reason, a.detail) for a in r.alternatives]
        return
    assert r.status == Status.INFEASIBLE
    assert any(k.family == family for k in r.conflict_keys)


@pytest.mark.parametrize("seed", range(16))
def test_lns_keeps_plans_valid_and_never_beats_the_optimum(seed, tmp_path):
    """LNS (optimizer/deployment/lns.py) on random small instances, one session at a time (even
    seeds) and batched with layouts (odd seeds): the plan passes the evaluator, its value is the
    evaluator's, never worse than the start and never better than the exhaustive optimum."""
    from optimizer.deployment.lns import lns

    if seed % 2 == 0:
        problem = replace(random_instance(seed, tmp_path), faults=())
    else:
        problem = random_batched(seed, tmp_path)
    objective = BOUND_OBJECTIVES[seed % len(BOUND_OBJECTIVES)]
    _search_checked(problem, objective, lambda a, start: lns(a, start, time.perf_counter() + 1.5, seed=seed),
                    (lambda: brute_force(problem, objective)[0]) if seed % 2 == 0
                    else (lambda: brute_force_batched(problem, objective)))


def _search_checked(problem, objective, search, exhaustive) -> None:
    """Run ``search(anytime, start)`` from the constructive plan (nothing to check without a
    plan that meets the requirement): the result passes the evaluator, its value is the
    evaluator's, never worse than the start and never better than ``exhaustive()``."""
    perf = PerfModel(problem)
    obj = get(objective)
    a = Anytime(problem, perf, obj, _kinds_layouts(problem))
    start = a.construct(time.perf_counter() + 5) if a.kinds else None
    if start is None or math.isinf(a.score(start)):
        return
    v0 = a.score(start)
    out = search(a, start)
    ev = evaluate(problem, a.plan(out), perf)
    assert ev.violations == []
    value = obj.value(ev)
    assert value == pytest.approx(a.score(out), rel=1e-9)
    assert value <= v0 * (1 + 1e-12)
    best = exhaustive()
    assert best is not None and value >= best * (1 - 1e-9)


def _random_anytime(seed: int, tmp_path):
    """(problem, perf model, Anytime for cost) of a random small instance: one session at a
    time without faults for even seeds, batched for odd ones."""
    problem = replace(random_instance(seed, tmp_path), faults=()) if seed % 2 == 0 else random_batched(seed, tmp_path)
    perf = PerfModel(problem)
    return problem, perf, Anytime(problem, perf, get("cost"), _kinds_layouts(problem))


@pytest.mark.parametrize("seed", range(12))
def test_packing_places_every_session_within_memory(seed, tmp_path):
    """Anytime.pack on every single-kind mix at a few makespan targets: each session placed
    once, the plan passes the evaluator (memory, GPUs), one at a time and batched."""
    problem, perf, a = _random_anytime(seed, tmp_path)
    packed = 0
    for mix in a.single_kind_mixes():
        for target in (0.05, 0.5, 5.0):
            sol = a.pack(mix, target)
            if sol is None:  # the instances' memory is full before every session is placed
                continue
            packed += 1
            placed = sorted(i for it in sol for i in it.sessions)
            assert placed == list(range(len(problem.sessions)))
            assert evaluate(problem, a.plan(sol), perf).violations == []
    if a.kinds and a.construct(time.perf_counter() + 5) is not None and len(a.kinds) == 1:
        assert packed > 0  # one kind: the greedy plan's mix is the packing's mix


def test_lp_on_time_never_falls_as_the_makespan_grows(tmp_path):
    """The 1,000-session batched benchmark case, where HiGHS once ended an LP "unknown" (counted
    as every session on time, which kept the bound valid but made it 15 % loose): solved again
    another way, the LP's on-time maximum is non-decreasing in the makespan threshold."""
    raw = generate_mixed(1000, 64, seed=0, types=12, fraction=0.6, max_batch=None)
    path = tmp_path / "b1000.yaml"
    problem = build_problem(raw, path)
    perf = PerfModel(problem)
    a = Anytime(problem, perf, get("cost"), _kinds_layouts(problem))
    lp = BoundLP(problem, perf, a.kinds)
    grid = sorted(set(np.round(np.linspace(0.55, 0.85, 31), 4)) | {0.5956})
    vals = [lp.max_on_time(float(T))[0] for T in grid]
    assert all(v2 >= v1 - 1e-6 for v1, v2 in zip(vals, vals[1:])), list(zip(grid, vals))


def test_progress_rows_for_cp_sat_runs():
    """--progress on runs that skip the anytime path (faults: the column search; latency: the
    sequence model) still shows rows, ending with the final incumbent and bound."""
    for args in (["instances/qwen32b_128k_fault.yaml"], ["instances/qwen32b_128k.yaml", "--objective", "latency"]):
        res = subprocess.run([sys.executable, "-m", "optimizer.cli", *args, "--format", "json", "--progress"],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert res.returncode == 0, res.stderr
        d = json.loads(res.stdout)
        assert "done" in res.stderr, res.stderr
        value = f"{d['objective']['value']:.6g}"
        assert value in res.stderr  # the final row shows the reported value


def test_time_limit_counts_the_interpreter_start_up():
    """``--time-limit`` counts from the process start (``/proc/self/stat`` on Linux), measured in
    a fresh interpreter (this test process may be older than the 60 s the reading trusts)."""
    res = subprocess.run([sys.executable, "-c", "from optimizer.budget import process_age_s; print(process_age_s())"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    age = float(res.stdout)
    assert 0.0 <= age < 60.0
    if Path("/proc/self/stat").exists():
        assert age > 0.0
    # a shell that works first and then execs the command keeps its PID: beyond MAX_STARTUP_S
    # the PID's age is not the command's start-up (the README's install-and-run line counted 37 s)
    if Path("/proc/self/stat").exists():
        code = ("import optimizer.budget as c; a = c.process_age_s(); c.MAX_STARTUP_S = 0.5; "
                "print(a >= 1.0, c.process_age_s())")
        res = subprocess.run(["bash", "-c", f"sleep 1; exec {sys.executable} -c '{code}'"], capture_output=True,
                             text=True, cwd=ROOT, timeout=60)
        assert res.stdout.split() == ["True", "0.0"], (res.stdout, res.stderr)


def test_short_limit_still_gives_a_plan(tmp_path, cli):
    """200 distinct batched sessions with --time-limit 2: the constructive phase runs past its
    share until some plan meets the on-time requirement, so a plan (not `time_limit`) comes back.
    In-process (the limit counted from the command's start, tests/conftest.py): in a fresh
    process under a parallel test run the interpreter's start-up alone took 2.3 s of the 2."""
    path = _mixed(tmp_path, max_batch=None, seed=3)
    res = cli(path, "--time-limit", "2", "--format", "json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["status"] in ("feasible", "optimal") and d["objective"]["value"] is not None


def test_limit_holds_when_even_the_first_plan_takes_too_long():
    """100,000 identical sessions, --time-limit 5: the list scheduling gives up at the deadline
    and the command ends with `time_limit` and the reason (exit 4), or a plan."""
    res = subprocess.run([sys.executable, "-m", "optimizer.cli", "instances/qwen32b_128k.yaml",
                          "--set", "workload.sessions.0.context_tokens=1000", "--set", "workload.sessions.0.count=100000",
                          "--set", "workload.min_on_time_fraction=0", "--set", "hardware.servers=64",
                          "--time-limit", "5", "--format", "json", "--progress"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    d = json.loads(res.stdout)  # (its wall time against the limit: bench_deployment.py --limits)
    if res.returncode == 4:
        assert d["status"] == "time_limit" and d["objective"]["value"] is None
        assert any("within the time limit" in n for n in d["notes"])
    else:
        assert res.returncode == 0 and d["status"] in ("feasible", "optimal")
    assert res.stderr.endswith("\n")  # the progress table's last line is ended


def test_progress_shows_no_gap_without_a_plan():
    """A constructive plan that misses the on-time requirement (value inf) shows no incumbent and no gap."""
    from optimizer.deployment.progress import Progress

    rows = []
    progress = Progress(rows.append, "x")
    progress.report("constructive plan", math.inf, 0.5)
    progress.report("LP bound", 1.0, 0.5)
    assert rows[0]["method"] == "constructive plan" and rows[0]["unit"] == "x"
    assert rows[0]["value"] is None and rows[0]["gap"] is None
    assert rows[1]["gap"] == pytest.approx(0.5)


@pytest.mark.slow
def test_azure_trace_5000_requests_get_a_plan_and_bound(tmp_path):
    """Issue acceptance: the first 5,000 requests of the Azure conversation trace on 64 HGX H100
    (batching, the default; deadline 2 s + 100 ms per generated token) get a plan with its bound
    within 120 s; here a 15 s limit already does (12 s measured alone), and the plan places every
    request."""
    from tests.scale_helpers import AZURE_CONV, generate_azure
    from tests.conftest import shared

    raw = generate_azure(shared(*AZURE_CONV.split("/")), max_batch=None)
    path = tmp_path / "azure.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    res = subprocess.run([sys.executable, "-m", "optimizer.cli", str(path), "--time-limit", "15", "--format", "json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    o = d["objective"]
    assert d["status"] in ("feasible", "optimal")
    assert o["value"] is not None and o["bound"] is not None and 0 < o["bound"] <= o["value"]
    assert sum(len(i["sessions"]) for i in d["plan"]["instances"]) == 5000


def _generated(tmp_path, *args, **kw):
    """(problem, perf model, Anytime for the cost objective) of ``generate_mixed(*args, **kw)``."""
    raw = generate_mixed(*args, **kw)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    problem = build_problem(raw, path)
    perf = PerfModel(problem)
    return problem, perf, Anytime(problem, perf, get("cost"), _kinds_layouts(problem))


def _cg_bounds(problem, objective):
    """(fluid LP bound, bound after the configuration LP, Anytime, BoundLP) in the objective's unit."""
    from optimizer.deployment.anytime import refined_bound_in_unit

    perf = PerfModel(problem)
    obj = get(objective)
    a = Anytime(problem, perf, obj, _kinds_layouts(problem))
    if not a.kinds:
        return None, None, a, None
    lp = BoundLP(problem, perf, a.kinds)
    b, _ = bound_in_unit(problem, obj, lp, None, time.perf_counter() + 30)
    r = refined_bound_in_unit(problem, obj, lp, time.perf_counter() + 30)
    return b, r, a, lp


def _cg_bound_checked(problem, objective, best):
    """Assert the configuration LP's bound is ≥ the fluid LP's and ≤ the exhaustive optimum
    ``best`` (None: no plan); (Anytime, BoundLP), or None when no bound applies or no plan exists."""
    b, r, a, lp = _cg_bounds(problem, objective)
    if b is None or lp.cg is None or r is None:
        return None
    assert r >= b * (1 - 1e-9)
    if best is None:
        return None
    assert r <= best * (1 + 1e-9) + 1e-12, (r, best)
    return a, lp


@pytest.mark.parametrize("seed", range(40))
def test_configuration_lp_bound_never_above_brute_force_optimum(seed, tmp_path):
    """One session at a time (cost and makespan objectives): the bound tightened by column
    generation stays ≤ the exhaustive optimum, never below the fluid LP's, and the integer master's plans pass the evaluator and
    never beat the optimum."""
    problem = replace(random_instance(seed, tmp_path), faults=())
    objective = ("cost", "makespan")[seed % 2]
    best, _ = brute_force(problem, objective)
    got = _cg_bound_checked(problem, objective, best)
    if got is None:
        return
    a, lp = got
    if lp.best_T is not None:
        got = lp.cg.integer_plan(lp.best_T * 1.05, time.perf_counter() + 10)
        if got:
            insts = a.from_classes(got)
            ev = evaluate(problem, a.plan(insts), PerfModel(problem))
            assert not ev.violations
            value = get(objective).value(ev)
            if ev.nominal.on_time >= problem.required_on_time:
                assert value >= best * (1 - 1e-9), (value, best)


@pytest.mark.slow
def test_configuration_lp_tightens_the_fluid_bound_on_twelve_session_types(tmp_path):
    """On the 1,000-session, 12-type case with one session at a time, the fluid LP is 19 % below
    the plans the heuristics find; the configuration LP's bound is over 5 % above it and stays a
    valid bound for its integer master's plan, which passes the evaluator. (How close the two
    come is a gap figure, wall-clock dependent: 2 % here alone, 3 % under a parallel run; the
    whole CLI run measured 0.24 % at 60 s: benchmarks/bench_deployment.py --acceptance.)"""
    problem, perf, a = _generated(tmp_path, 1000, 64, seed=0, types=12, fraction=0.6, max_batch=1)
    obj = get("cost")
    lp = BoundLP(problem, perf, a.kinds)
    b, _ = bound_in_unit(problem, obj, lp, None, time.perf_counter() + 30)
    from optimizer.deployment.anytime import refined_bound_in_unit

    r = refined_bound_in_unit(problem, obj, lp, time.perf_counter() + 60)
    assert r > b * 1.05
    got = lp.cg.integer_plan(lp.best_T * 1.01, time.perf_counter() + 60)  # 10 s found none on a loaded machine
    assert got is not None
    ev = evaluate(problem, a.plan(a.from_classes(got)), perf)
    assert not ev.violations
    assert obj.value(ev) >= r * (1 - 1e-9), (obj.value(ev), r)


@pytest.mark.parametrize("seed", range(48))  # 80 before; 48 keep CI under 10 min (24 with urgent deadlines)
def test_configuration_lp_bound_never_above_batched_brute_force(seed, tmp_path):
    """Layouts and batched decode: the configuration LP's relaxed columns (batch limits, the
    urgent window) keep the bound ≤ the exhaustive optimum of the search space. Half of the
    seeds draw deadlines close to the sessions' single-session times, so that the urgent-window rows
    take part (about half of those instances)."""
    problem = random_batched(seed, tmp_path, **({"deadlines": range(5, 80, 2)} if seed % 4 >= 2 else {}))
    objective = ("cost", "makespan")[seed % 2]
    _cg_bound_checked(problem, objective, brute_force_batched(problem, objective))


@pytest.mark.parametrize("max_batch", [1, None])
def test_configuration_lp_never_below_a_plan_it_could_have_built(tmp_path, max_batch):
    """At a heuristic plan's makespan M, the configuration LP's bound on the on-time sessions is
    at least the plan's on-time count (a mid-size case the brute force cannot reach; uncovered
    sessions in its master must not be read as infeasibility)."""
    from optimizer.deployment.colgen import ConfigLP

    problem, perf, a = _generated(tmp_path, 300, 20, seed=1, types=8, fraction=0.6, max_batch=max_batch)
    plan = a.construct(time.perf_counter() + 10)
    r = a.scenario(plan)
    cg = ConfigLP.for_problem(problem, a.kinds)
    u = cg.upper(r.makespan_s, time.perf_counter() + 60)
    assert u is not None and u >= r.on_time - 1e-6, (u, r.on_time)


def test_configuration_lp_does_not_mistake_a_paying_uncovered_session_for_infeasibility():
    """Two 1-GPU instances, makespan 1 s: a heavy session without deadline fills one instance's
    memory, ten light ones (0.1 s, deadline 0.5 s) fit five on time per instance. Covering every
    session gives 1 + 5 on time; leaving the heavy one out would give 10, more than its penalty
    costs, so the master leaves it uncovered, yet a plan exists: the bound must be ≥ 6, not the
    "no plan" −1."""
    from optimizer.deployment.colgen import ConfigLP
    from optimizer.deployment.params import ConfigKind as _Kind

    kind = _Kind(1, np.array([1.0, 0.1]), np.array([[10.0, 0.5]]), np.array([10.0]))
    cg = ConfigLP(np.array([1.0, 10.0]), np.array([np.inf, 0.5]), [kind], 2)
    u = cg.upper(1.0, time.perf_counter() + 30)
    assert u is not None and u >= 6 - 1e-6, u
    assert cg.upper(0.99, time.perf_counter() + 30) == -1.0  # the heavy session alone takes 1 s


def test_no_list_scheduling_plan_still_gets_one_from_the_configuration_lp(tmp_path):
    """300 sessions in 8 types, one at a time, 80 % on time: list scheduling misses the
    requirement on every mix (the run used to end after ~1.3 s with `time_limit` and no plan,
    whatever the limit); the configuration LP's most-on-time integer master finds a plan that
    meets it and passes the evaluator."""
    from optimizer.deployment.anytime_solve import most_on_time_plan

    problem, perf, a = _generated(tmp_path, 300, 20, seed=1, types=8, fraction=0.8, max_batch=1)
    first = a.construct(time.perf_counter() + 10)
    assert a.scenario(first).on_time < problem.required_on_time  # the case this test is about
    sol = most_on_time_plan(problem, a, time.perf_counter() + 30)
    assert sol is not None
    ev = evaluate(problem, a.plan(sol), perf)
    assert not ev.violations
    assert ev.nominal.on_time >= problem.required_on_time


def test_latency_objective_keeps_the_time_limit_on_a_large_case(tmp_path, cli):
    """The latency objective's sequence model for 200 distinct sessions takes over a minute to
    build (the command used to run 80 s on a 10 s limit). The exact search's build now stops at
    its deadline (``time_limit``, and why); the command takes the anytime path at this size and
    returns a plan."""
    raw = generate_mixed(200, 16, seed=0, max_batch=1)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    problem = build_problem(raw, path)
    out = solve_exact(problem, get("latency"), time.perf_counter() + 5)  # (it took 80 s; wall times: bench_deployment.py --limits)
    assert out.status == Status.TIME_LIMIT and out.value is None
    assert any("reached the time limit" in n for n in out.notes)
    res = cli(path, "--objective", "latency", "--time-limit", "5", "--format", "json")  # in-process (start-up)
    d = json.loads(res.stdout)
    assert res.exit_code == 0 and d["status"] == "feasible" and d["plan"] is not None


def test_batched_columns_admit_every_simulated_instance(tmp_path):
    """Every instance the batched timeline runs (random class mixes with the urgent 37-token,
    208 ms class and sessions shorter than it, every batch limit the search tries) is a column of
    the configuration LP at its simulated makespan with its simulated on-time sessions: the
    relaxation's load (:meth:`ConfigLP.batched_load`) is not above the makespan and the pricing
    MIP admits it. Some mixes run queued behind a batch limit with idle slots bounded by
    ``_idle`` below the per-session sum, so that bound is exercised."""
    from optimizer.deployment.batching import admission_order, batch_limits, simulate
    from optimizer.deployment.colgen import ConfigLP

    problem, perf, a = _generated(tmp_path, 1000, 64, seed=0, types=12, fraction=0.6, max_batch=None)
    cg = ConfigLP.for_problem(problem, a.kinds)
    assert cg.urgent is not None
    rng = np.random.default_rng(5)
    classes = problem.classes
    C = len(classes)
    nu0 = cg.urgent[1]
    weights = np.where((cg.dl <= cg.urgent[0]) | (cg.new < nu0), 3.0, 1.0)
    tighter = checked = 0
    big = [n for n, kd in enumerate(a.kinds) if kd.gpus >= 4]
    # first a mix whose idle bound needs the longer short class (33 tokens) taken before the
    # shorter (11) although the one between (19) is absent
    mixes = [(big[-1], np.array([0, 5, 0, 0, 0, 0, 5, 0, 2, 0, 0, 1]))]
    for trial in range(120):
        x = np.bincount(rng.choice(C, size=int(rng.integers(3, 14)), p=weights / weights.sum()), minlength=C)
        mixes.append((int(rng.choice(big)), x))
    for k, x in mixes:
        kind = a.kinds[k]
        n = int(x.sum())
        if np.any(kind.static + kind.kv @ x > problem.gpu.memory_bytes) or not np.all(np.isfinite(kind.alone[x > 0])):
            continue
        jobs = [(c.context, c.new, c.deadline_s) for c in classes for _ in range(x[c.index])]
        cls = [c.index for c in classes for _ in range(x[c.index])]
        for b in batch_limits(n, kind.batch_cap):
            if b == 1:
                continue
            order = admission_order(jobs, [0] * n, b)
            fin = np.array(simulate(perf, kind.layout, [jobs[o][:2] for o in order], b)[1])
            on = [cls[o] for o, f in zip(order, fin) if f <= jobs[o][2] + 1e-9]
            y = np.bincount(on, minlength=C) if on else np.zeros(C, dtype=np.int64)
            M = float(fin.max())
            assert cg.batched_load(k, x, y) <= M * (1 + 1e-9), (kind.layout.label(), b, x, y, M)
            assert cg.admits(k, M * (1 + 1e-9), x, y, time.perf_counter() + 30), (kind.layout.label(), b, x, y, M)
            # and the pricing MIP is no looser than the load the pool charges (else column
            # generation stops at a column the pool rejects)
            for y2 in (y, x * (cg.dl <= cg.urgent[0]) + y * (cg.dl > cg.urgent[0])):
                L = cg.batched_load(k, x, y2)
                if math.isfinite(L):
                    assert not cg.admits(k, L * (1 - 1e-6), x, y2, time.perf_counter() + 30), (b, x, y2, L)
            checked += 1
            if b < n:
                assert _idle_slot_steps([jobs[o][1] for o in order], b, int(nu0)) <= cg._idle(x, b) + 1e-9
                tighter += cg._idle(x, b) < float(np.sum(np.maximum(nu0 - cg.new, 0) * x)) - 1e-9
    assert checked >= 100 and tighter >= 20, (checked, tighter)


def _idle_slot_steps(new: list[int], b: int, steps: int) -> int:
    """Idle slot-steps in the first ``steps`` steps of sessions decoding ``new`` tokens each, in
    this admission order, behind batch limit b (the slot model of the batched timeline)."""
    queue, active, idle = list(new), [], 0
    for _ in range(steps):
        while queue and len(active) < b:
            active.append(queue.pop(0))
        idle += b - len(active)
        active = [r - 1 for r in active if r > 1]
    return idle


@pytest.mark.slow  # 60-120 s
def test_a_plan_short_of_the_on_time_requirement_is_repaired_by_lns(tmp_path):
    """300 distinct sessions one at a time, 84 % on time: every list-scheduling plan misses the
    requirement and the configuration LP does not apply (300 classes); LNS climbing on the
    shortfall (:attr:`Anytime.repairing`) reaches it, and the plan passes the evaluator (the
    solve had answered "no plan" after 1.3 s whatever its time limit)."""
    from optimizer.deployment.anytime_solve import repair_on_time

    raw = generate_mixed(300, 16, seed=3, fraction=0.84)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    problem = build_problem(raw, path)
    perf = PerfModel(problem)
    a = Anytime(problem, perf, get("cost"), _kinds_layouts(problem))
    start = a.construct(time.perf_counter() + 10)
    assert math.isinf(a.score(start)) and a.scenario(start).on_time < a.need
    got = repair_on_time(a, start, time.perf_counter() + 120)
    assert got is not None and not a.repairing
    ev = evaluate(problem, a.plan(got), perf)
    assert not ev.violations and ev.nominal.on_time >= a.need
    assert math.isfinite(a.score(got))


def test_latency_at_scale_gets_a_plan_without_a_bound(tmp_path):
    """Beyond 60 sessions the latency objective (mean finish, a sequence objective) takes the
    anytime path: a plan that passes the evaluator, status feasible, no bound (the sequence
    formulation alone had returned no plan on 300 sessions)."""
    raw = generate_mixed(100, 8, seed=2)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    problem = build_problem(raw, path)
    out = solve_deployment(problem, "latency", 8)
    assert out.status == Status.FEASIBLE and out.value is not None and out.bound is None
    assert out.evaluation is not None and not out.evaluation.violations
    assert out.value == pytest.approx(get("latency").value(out.evaluation))
    assert "anytime" in out.mode


@pytest.mark.parametrize("max_batch", [1, None])
def test_instance_mix_search_plans_pass_the_evaluator_and_never_lose_to_its_starts(tmp_path, max_batch):
    """The instance-mix search (anytime step 2c) on 60 generated sessions: every plan it returns
    places each session once and passes the evaluator; they come best first; the best is no
    worse than the best plan of each start mix at the same targets (one session at a time,
    this seed, at least 1 % better), and is at least the LP bound."""
    from optimizer.deployment import anytime_solve as AS

    problem = build_problem(yaml.safe_load(_mixed(tmp_path, n=60, servers=4, max_batch=max_batch).read_text()),
                            tmp_path / "mixed.yaml")
    perf = PerfModel(problem)
    obj = get("cost")
    a = Anytime(problem, perf, obj, _kinds_layouts(problem))
    first = a.construct(time.perf_counter() + 5)
    lp = BoundLP(problem, perf, a.kinds)
    bound, mix = bound_in_unit(problem, obj, lp, a.scenario(first), time.perf_counter() + 30)
    assert lp.best_T is not None and mix is not None
    start = a.mixes(mix)[0]
    plans = AS.mix_search(a, lp.best_T, [start], first, time.perf_counter() + 60)
    assert plans
    values = [a.value_of(a.scenario(p)) for p in plans]
    assert values == sorted(values)
    for p in plans[:5]:
        assert sorted(i for it in p for i in it.sessions) == list(range(len(problem.sessions)))
        ev = evaluate(problem, a.plan(p), perf)
        assert ev.violations == []
        assert obj.value(ev) == pytest.approx(a.value_of(a.scenario(p)), rel=1e-6)
    own = {}
    for it in first:
        own[it.kind] = own.get(it.kind, 0) + 1
    for m in (start, own):
        at_start = [s for f, build in [(f, a.pack) for f in AnytimeSettings().mix_pack] + [(f, a.greedy) for f in AnytimeSettings().mix_greedy]
                    if (s := build(dict(m), lp.best_T * f)) is not None]
        start_best = min((a.value_of(a.scenario(a.choose_rule(s))) for s in at_start), default=math.inf)
        assert values[0] <= start_best * (1 + 1e-9)
        if max_batch == 1:  # here the climb pays: 1.430 and 1.400 at the starts, 1.374 found
            assert values[0] <= start_best * 0.99
    assert values[0] >= bound * (1 - 1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_rebalance_sweeps_keep_plans_valid_and_only_improve(seed, tmp_path):
    """Anytime.rebalance on list-scheduling plans of generated one-at-a-time traffic: each
    session placed once, the plan passes the evaluator with the value rebalance claims, the
    value improves (or None is returned) and the on-time requirement still holds; on seed 0
    (measured: 1.3718 -> 1.2069 on the 200-session case) the sweep lowers the makespan."""
    raw = generate_mixed(200 if seed == 0 else 60, 16 if seed == 0 else 4, seed=seed, max_batch=1)
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    problem = build_problem(raw, path)
    perf = PerfModel(problem)
    obj = get("cost")
    a = Anytime(problem, perf, obj, _kinds_layouts(problem))
    start = a.construct(time.perf_counter() + 5)
    v0 = a.score(start)
    got = a.rebalance(start, v0, time.perf_counter() + 30)
    if seed == 0:
        assert got is not None and a.scenario(got[0]).makespan_s < a.scenario(start).makespan_s
    if got is None:
        return
    insts, v = got
    assert v < v0
    assert sorted(i for it in insts for i in it.sessions) == list(range(len(problem.sessions)))
    ev = evaluate(problem, a.plan(insts), perf)
    assert ev.violations == []
    assert obj.value(ev) == pytest.approx(v, rel=1e-9)
    assert a.scenario(insts).on_time >= a.need


@pytest.mark.parametrize("seed", range(0, 24, 2))
def test_improve_with_rebalancing_never_beats_the_brute_force_optimum(seed, tmp_path):
    """Anytime.improve (rebalancing sweeps, then moves out of the latest instance) on random
    small one-at-a-time instances, for the cost, makespan and energy objectives: the plan
    passes the evaluator with the value improve scored, never worse than the start and never
    better than the exhaustive optimum."""
    problem = replace(random_instance(seed, tmp_path), faults=())
    objective = BOUND_OBJECTIVES[(seed // 2) % len(BOUND_OBJECTIVES)]
    _search_checked(problem, objective, lambda a, start: a.improve(start, time.perf_counter() + 1.0),
                    lambda: brute_force(problem, objective)[0])


def test_rebalance_of_lopsided_plans_never_beats_the_brute_force_optimum(tmp_path):
    """Anytime.rebalance from a lopsided plan (every session but one on one instance, one
    session on a second instance of the same kind) on random small one-at-a-time instances:
    valid plans, the evaluator's value, never better than the exhaustive optimum, and the
    sweep does improve most of them."""
    from optimizer.deployment.params import Inst

    tried = improved = 0
    for seed in range(0, 40, 2):
        (tmp_path / str(seed)).mkdir()
        problem = replace(random_instance(seed, tmp_path / str(seed)), faults=())
        objective = BOUND_OBJECTIVES[(seed // 2) % len(BOUND_OBJECTIVES)]
        perf = PerfModel(problem)
        obj = get(objective)
        a = Anytime(problem, perf, obj, _kinds_layouts(problem))
        n = len(problem.sessions)
        ks = [k for k, kd in enumerate(a.kinds) if problem.total_gpus // kd.gpus >= 2 and n >= 3
              and a.fits(k, list(range(n))) and bool(np.all(kd.fits[a.cls]))]
        if not ks:
            continue
        k = ks[0]
        start = [a.run(Inst(k, list(range(n - 1)))), a.run(Inst(k, [n - 1]))]
        v0 = a.score(start)
        if math.isinf(v0):
            continue
        tried += 1
        got = a.rebalance(start, v0, time.perf_counter() + 2)
        if got is None:
            continue
        improved += 1
        insts, v = got
        ev = evaluate(problem, a.plan(insts), perf)
        assert ev.violations == []
        assert obj.value(ev) == pytest.approx(v, rel=1e-9) and v < v0
        best = brute_force(problem, objective)[0]
        assert best is not None and v >= best * (1 - 1e-9)
    assert tried >= 5 and improved >= tried // 2, (tried, improved)


def test_most_on_time_mix_meets_the_requirement_where_list_scheduling_misses_it(tmp_path):
    """1,000 distinct sessions on 32 servers at 80 % on time (generator seed 5; a fresh user's
    case that used to end with no plan): list scheduling reaches fewer than 800 on time (762
    measured), the earliest-deadline best fit with Moore-Hodgson exchanges over a climb of
    instance mixes reaches the 800, and its plan passes the evaluator."""
    from optimizer.deployment import anytime_solve as AS

    raw = generate_mixed(1000, 32, seed=5, fraction=0.8, max_batch=1)
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    problem = build_problem(raw, path)
    perf = PerfModel(problem)
    a = Anytime(problem, perf, get("cost"), _kinds_layouts(problem))
    assert a.need == 800
    listed = a.construct(time.perf_counter() + 5)
    assert a.scenario(listed).on_time < a.need
    sol = AS.most_on_time_mix(a, time.perf_counter() + 60)
    assert sol is not None and a.scenario(sol).on_time >= a.need
    assert sorted(i for it in sol for i in it.sessions) == list(range(1000))
    assert evaluate(problem, a.plan(sol), perf).violations == []


@pytest.mark.parametrize("seed", range(0, 16, 2))
def test_most_on_time_plans_are_valid_and_never_beat_brute_force(seed, tmp_path):
    """Anytime.most_on_time on every single-kind mix of random small one-at-a-time instances:
    each session placed once, the plan passes the evaluator, and its on-time count is never
    above the most that any assignment to single-kind instances reaches (by exhaustion)."""
    problem = replace(random_instance(seed, tmp_path), faults=())
    perf = PerfModel(problem)
    a = Anytime(problem, perf, get("cost"), _kinds_layouts(problem))
    most = _max_on_time_brute(problem, perf)
    for k, kd in enumerate(a.kinds):
        n = problem.total_gpus // kd.gpus
        if n == 0:
            continue
        sol = a.most_on_time({k: n})
        if sol is None:
            continue
        assert sorted(i for it in sol for i in it.sessions) == list(range(len(problem.sessions)))
        ev = evaluate(problem, a.plan(sol), perf)
        assert ev.violations == []
        assert a.scenario(sol).on_time <= most


def _max_on_time_brute(problem, perf) -> int:
    """Most sessions on time over every assignment of the sessions to instances of one kind
    (each kind on all its instances), every instance run in Moore-Hodgson order, by exhaustion:
    any plan's instances are a subset of these."""
    import itertools

    from optimizer.deployment.params import Inst

    a = Anytime(problem, perf, get("cost"), _kinds_layouts(problem))
    S = len(problem.sessions)
    best = 0
    for k, kd in enumerate(a.kinds):
        n = problem.total_gpus // kd.gpus
        if n == 0:
            continue
        for assign in itertools.product(range(min(n, S)), repeat=S):
            groups = [[i for i in range(S) if assign[i] == j] for j in range(min(n, S))]
            if not all(a.fits(k, g) for g in groups if g):
                continue
            insts = [a.run(Inst(k, g)) for g in groups if g]
            best = max(best, sum(int(np.sum(it.finish <= a.dl[it.order] + 1e-9)) for it in insts))
    return best


@pytest.mark.parametrize("max_batch", [1, None])
def test_issue_acceptance_thousand_sessions_get_a_plan_within_10_s(tmp_path, max_batch):
    """The 1,000-session case in 12 types on 64 servers: with `--time-limit 10` a feasible plan
    with its bound and gap (the issue's first report: `value null` after 90 s). The issue's
    targets at 60 s (gap <= 5 % on 200 distinct sessions, <= 2 % here) and the time to the first
    plan are measured by ``benchmarks/bench_deployment.py --acceptance``, not here."""
    from tests.scale_helpers import run_cli_process, write

    raw = generate_mixed(1000, 64, seed=0, types=12, fraction=0.6, max_batch=max_batch)
    code, d, err = run_cli_process(write(raw, tmp_path), "--time-limit", "10", "--progress")
    assert code == 0 and d is not None, err
    o = d["objective"]
    assert d["status"] == "feasible" and o["value"] is not None and o["bound"] is not None, d["status"]
    assert 0 < o["bound"] <= o["value"] and o["gap"] == pytest.approx((o["value"] - o["bound"]) / o["value"], rel=1e-6)
    assert "constructive plan" in err  # the progress table shows the first plan


def _sigma_problem(tmp_path, config, layouts, servers=1, context=8_000):
    raw = {"name": "sigma", "model": {"config": str(ROOT / "instances" / "models" / config)},
           "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": servers},
           "performance": {"source": "chapter"},
           "workload": {"sessions": [{"name": "a", "count": 300, "context_tokens": context, "new_tokens": 16},
                                     {"name": "b", "count": 300, "context_tokens": 4 * context, "new_tokens": 8}]},
           "deployment": {"reserve_gib_per_gpu": 2, "layouts": layouts}}
    path = tmp_path / "sigma.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return build_problem(raw, path)


def _check_sigma(problem, rng, draws=60):
    """Every batched kind: a step of b sessions at random contexts (b up to what memory holds)
    takes at least w + σ·(b − 1) + their KV reads, the split the LP rows use."""
    from optimizer.deployment.params import kv_and_weight_rates
    from optimizer.model.perf import batch_step_table

    perf = PerfModel(problem)
    a = Anytime(problem, perf, get("cost"), _kinds_layouts(problem))
    table = batch_step_table(perf.model)
    checked = 0
    for k in a.kinds:
        if k.batch_cap == 1:
            continue
        w, kv_rate = kv_and_weight_rates(perf, k.layout)
        assert k.sigma < w
        room = problem.gpu.memory_bytes - k.static
        b_max = int(min(k.batch_cap, np.min(room / np.min(k.kv[:, k.fits], axis=1))))
        for _ in range(draws):
            b = int(rng.integers(1, max(2, b_max) + 1))
            pos = rng.integers(0, 2 * max(c.context for c in problem.classes), size=b).astype(float)
            step = float(table.step_times_s(k.layout, pos, 1)[0])
            floor = w + k.sigma * (b - 1) + kv_rate * float(np.sum(pos + 1.0))
            assert step >= floor * (1 - 1e-9), (k.layout.label(), b, step, floor)
            checked += 1
    return a, checked


@pytest.mark.parametrize("seed", range(30))
def test_session_step_floor_holds_on_random_layouts(seed, tmp_path):
    """σ (Kind.sigma) is a valid per-session step cost on the brute-force instances' layouts
    (TP, PP 2, attention DP, batch caps)."""
    problem = random_batched(seed, tmp_path)
    _check_sigma(problem, np.random.default_rng(seed))


@pytest.mark.parametrize("config,layouts", [
    ("qwen3-32b.json", [{"attention": {"tp": 8}}, {"attention": {"tp": 2}}, {"attention": {"tp": 4}, "pp": 2}]),
    ("qwen3-30b-a3b.json", [{"attention": {"tp": 8}}, {"attention": {"tp": 8}, "experts": {"tp": 1, "ep": 8}},
                            {"attention": {"tp": 2}, "pp": 4}]),
])
def test_session_step_floor_holds_on_dense_and_moe_layouts(config, layouts, tmp_path):
    """σ holds on real dense and MoE configs (expert reads and All-to-All grow with the batch)
    and PP hand-offs, up to the batch memory allows."""
    a, checked = _check_sigma(_sigma_problem(tmp_path, config, layouts), np.random.default_rng(0), draws=200)
    assert checked >= 200


def test_session_step_floor_is_the_tp_allreduce_growth(tmp_path):
    """Golden value: on a plain TP8 Qwen3-32B instance (HBM-bound at these batches) each session
    adds its share of the two ring AllReduces per layer: 2·64 layers · 2·(7/8) · 5,120 · 2 B over
    NVLink's 450 GB/s = 5.097 µs (eq. of the alpha-beta ring; HGX H100 catalog bandwidth)."""
    a, _ = _check_sigma(_sigma_problem(tmp_path, "qwen3-32b.json", [{"attention": {"tp": 8}}]),
                        np.random.default_rng(1), draws=10)
    expected = 2 * 64 * 2 * 7 / 8 * 5_120 * 2 / 450e9
    assert a.kinds[0].sigma == pytest.approx(expected, rel=1e-6)
