"""Property test: on random small instances (≤ 6 heterogeneous sessions, 1–2 servers,
faults, every objective) the solver's optimum equals an exhaustive search over every
deployment, assignment and order, evaluated by the independent evaluator. With layouts (TP,
PP, DP attention) and batched decode: every multiset of instances, assignment, batch limit and
admission order of the documented search space (``optimizer.deployment.batching``)."""
from __future__ import annotations

import random

import pytest

from optimizer.deployment.schema import build_problem
from optimizer.deployment.strategy import solve_deployment
from optimizer.result import Status
from optimizer.deployment.perf import PerfModel
from tests.deploy_helpers import (assert_solver_equals_brute_force, brute_force, brute_force_batched, random_batched,
                                  write_tiny_config)

OBJECTIVES = ["cost", "makespan", "latency", "energy", "gpus", "dollars"]


def random_instance(seed: int, folder):
    rng = random.Random(seed)
    cfg = write_tiny_config(folder)
    gpus, servers = rng.choice([(2, 1), (4, 1), (2, 2), (1, 2), (4, 2)])
    n_max = 3 if (gpus, servers) == (4, 2) else (6 if gpus * servers <= 2 else 5)
    n_groups = rng.randint(1, 3)
    sessions, total = [], 0
    for g in range(n_groups):
        count = rng.randint(1, 3)
        count = min(count, n_max - total)
        if count <= 0:
            break
        total += count
        sessions.append({"name": f"g{g}", "count": count, "context_tokens": rng.randrange(5_000, 60_000, 1000),
                         "new_tokens": rng.randint(2, 6), "deadline_ms": rng.choice([None, *range(40, 400, 7)])})
    faults = []
    if rng.random() < 0.35:
        f = {"at_ms": float(rng.randint(0, 120)), "stall_ms": float(rng.randint(5, 60))}
        if rng.random() < 0.5:
            f["gpu"] = rng.randrange(gpus * servers)
        faults.append(f)
    raw = {
        "name": f"random {seed}",
        "model": {"config": str(cfg)},
        "hardware": {
            "gpu": {"name": "small", "memory_gb": rng.choice([0.2, 0.3, 0.5]), "memory_bandwidth_gb_s": 10.0,
                    "bf16_tflops": 50.0, "power_w": 300.0, "dollars_per_gpu_hour": 2.5},
            "server": {"name": "box", "gpus": gpus, "power_kw": 2.0,
                       "scale_up": {"bandwidth_gb_s": 50.0, "latency_us": 20.0},
                       "scale_out": {"bandwidth_gb_s": 5.0, "latency_us": 60.0}},
            "servers": servers,
        },
        "performance": {"source": "chapter"},
        "workload": {"sessions": sessions, "min_on_time_fraction": rng.choice([0.0, 0.5, 0.75, 1.0])},
        "deployment": {"reserve_gib_per_gpu": 0.01, "allreduce": rng.choice(["ring", "tree", "best"]), "max_batch": 1},
        "faults": faults,
    }
    return build_problem(raw, folder / "random.yaml")


@pytest.mark.parametrize("seed", range(48))
def test_solver_equals_brute_force(seed, tmp_path):
    problem = random_instance(seed, tmp_path)
    objective = OBJECTIVES[seed % len(OBJECTIVES)]
    best, _ = brute_force(problem, objective)
    out = solve_deployment(problem, objective, time_limit_s=60)
    if best is None:
        assert out.status == Status.INFEASIBLE
        return
    if objective == "dollars" and problem.faults:
        # the solver bills nominal busy times (a valid lower bound); the evaluator the worst case
        assert out.bound <= best * (1 + 1e-9) and out.value >= best * (1 - 1e-9)
        assert out.status == Status.OPTIMAL or out.value > best * (1 + 1e-9) or out.bound < best
        return
    assert out.status == Status.OPTIMAL, out.notes
    assert out.evaluation.violations == []
    assert out.value == pytest.approx(best, rel=1e-6, abs=1e-9)


BATCHED_OBJECTIVES = ["cost", "makespan", "energy", "gpus", "dollars", "latency"]


@pytest.mark.parametrize("seed", range(20))
def test_batched_solver_equals_brute_force(seed, tmp_path):
    assert_solver_equals_brute_force(random_batched(seed, tmp_path), BATCHED_OBJECTIVES[seed % len(BATCHED_OBJECTIVES)])


@pytest.mark.parametrize("seed", range(6))
def test_batched_solver_with_context_parallel_layouts_equals_brute_force(seed, tmp_path):
    """The random batched instances with a TP1xCP2 layout added: the search equals the exhaustive one."""
    assert_solver_equals_brute_force(random_batched(seed, tmp_path, cp=True),
                                     BATCHED_OBJECTIVES[seed % len(BATCHED_OBJECTIVES)])


@pytest.mark.parametrize("seed", range(16, 24))
def test_most_on_time_equals_brute_force(seed, tmp_path):
    """The infeasibility explanation's 'at most k on time' is the brute-force maximum."""
    from optimizer.deployment.batching import max_on_time_batched
    from dataclasses import replace
    problem = replace(random_batched(seed, tmp_path, deadlines=range(15, 90, 3)), min_on_time_fraction=0.0)
    assert max_on_time_batched(problem, PerfModel(problem), 30) == brute_force_batched(problem, "cost", most_on_time=True)
