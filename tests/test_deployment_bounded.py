"""The bounded column search (issue #25 item 3): every piece against exhaustive enumeration.

* the shared model's step floor is below every batched decode step;
* the majorisation behind the makespan bound (capped conjugate) holds for every run;
* each column's optimistic points dominate every schedule of it (every batch limit and
  admission order, simulated), and the order search's Pareto front equals the exhaustive one;
* the cover programme equals a brute force over column multisets;
* the issue's batched MoE case is proven optimal with its value.
"""
from __future__ import annotations

import itertools
import json
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from optimizer.deployment.batching import _column, pareto, simulate
from optimizer.deployment.bounded import (BoundedColumns, ColumnPool, CoverDP, Optimistic, capped_conjugate,
                                          merged_problem)
from optimizer.deployment.params import layout_options
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import build_problem
from optimizer.model.layout import Layout
from optimizer.model.perf import _concave_floor
from tests.conftest import INSTANCES

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
        "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False}
TINY_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 512, "head_dim": 64,
            "intermediate_size": 1536, "moe_intermediate_size": 256, "num_experts": 16, "num_experts_per_tok": 4,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 2, "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False,
            "max_position_embeddings": 200000}


def _instance(seed: int, folder):
    """A small random batched instance (dense or MoE, 2-4 classes of 1-2 sessions, deadlines
    around the sessions' times, TP / PP / DP attention / EP layouts, batch limit 2-4 or none)."""
    rng = random.Random(seed)
    moe = rng.random() < 0.5
    cfg = folder / ("moe.json" if moe else "tiny.json")
    cfg.write_text(json.dumps(TINY_MOE if moe else TINY))
    sessions = [{"name": f"s{i}", "count": rng.choice([1, 1, 2]), "context_tokens": rng.randrange(2000, 40000, 1000),
                 "new_tokens": rng.randint(2, 9), "deadline_ms": rng.choice([None, round(rng.uniform(5, 120), 1)])}
                for i in range(rng.randint(2, 4))]
    layouts = [{"attention": {"tp": 1}}, {"attention": {"tp": 2}}, {"attention": {"tp": 1}, "pp": 2},
               {"attention": {"tp": 1, "dp": 2}}]
    if moe:
        layouts += [{"attention": {"tp": 1, "dp": 2}, "experts": {"tp": 1, "ep": 2}},
                    {"attention": {"tp": 2}, "experts": {"tp": 1, "ep": 2}}]
    raw = {"name": f"bounded {seed}", "model": {"config": str(cfg)},
           "hardware": {"gpu": {"name": "small", "memory_gb": rng.choice([0.3, 0.5, 1.0]), "memory_bandwidth_gb_s": 10.0,
                                "bf16_tflops": rng.choice([50.0, 0.5]), "power_w": 300.0, "dollars_per_gpu_hour": 2.5},
                        "server": {"name": "box", "gpus": 4, "power_kw": 2.0,
                                   "scale_up": {"bandwidth_gb_s": 50.0, "latency_us": 20.0},
                                   "scale_out": {"bandwidth_gb_s": 5.0, "latency_us": 60.0}}, "servers": 1},
           "performance": {"source": "chapter"},
           "workload": {"sessions": sessions, "min_on_time_fraction": 0.0},
           "deployment": {"reserve_gib_per_gpu": 0.01, "layouts": layouts, "max_batch": rng.choice([2, 3, 4, None])}}
    return build_problem(raw, folder / "bounded.yaml"), rng


def _every_schedule(problem, perf, lay, counts):
    """Every batch limit and every admission order (permutations, duplicates removed) of a column."""
    base = [i for i, k in enumerate(counts) for _ in range(k)]
    mem = problem.gpu.memory_bytes * (1 + 1e-12)
    out = []
    for b in range(1, min(len(base), problem.batch_cap) + 1):
        for order in set(itertools.permutations(base)):
            col = _column(problem, perf, lay, tuple(counts), list(order), b, mem, rule=False)
            if col is not None:
                out.append(col)
    return out


def _front(points) -> set:
    pts = set(points)
    return {a for a in pts if not any(b != a and b[0] <= a[0] and b[1] >= a[1] for b in pts)}


@pytest.mark.parametrize("seed", range(12))
def test_step_floor_is_below_every_step(seed, tmp_path):
    problem, rng = _instance(seed, tmp_path)
    m = PerfModel(problem).model
    for lay in problem.layouts:
        floor = m.decode_step_floor(lay, 8)
        g = floor.g
        assert g[0] == 0 and np.all(np.diff(g) >= -1e-15) and np.all(np.diff(g, 2) <= 1e-15)
        for _ in range(25):
            b = rng.randint(1, 8)
            pos = np.array([rng.randrange(100, 60000) for _ in range(b)], dtype=float)
            rank = np.array([rng.randrange(lay.attention_dp) for _ in range(b)])
            step = m.step(lay, pos, rank=rank).total_s
            assert step >= (g[b] + floor.kv_rate * (pos + 1).sum() / floor.dp) * (1 - 1e-9)


def test_step_floor_of_the_issue_models():
    """Qwen3-30B-A3B (MoE) and Qwen3-32B (dense) on an HGX H100, every default layout."""
    from optimizer.deployment.api import load

    p = load(INSTANCES / "qwen3_30b_a3b_batched.yaml")
    m = PerfModel(p).model
    rng = np.random.default_rng(1)
    for lay in p.layouts:
        floor = m.decode_step_floor(lay, 16)
        for b in range(1, 17):
            pos = rng.integers(1000, 40000, b).astype(float)
            step = m.step(lay, pos).total_s
            assert step >= (floor.g[b] + floor.kv_rate * (pos + 1).sum() / floor.dp) * (1 - 1e-9)
        if lay.attention_dp == 1 and lay.pp == 1:  # one rank: the floor is the zero-context step's HBM part
            assert floor.g[1] == pytest.approx(m.step(lay, np.array([-1.0])).local_s + m.step(lay, np.array([-1.0])).allreduce_s
                                               + m.step(lay, np.array([-1.0])).alltoall_s, rel=1e-9)


def test_concave_floor():
    rng = np.random.default_rng(0)
    for _ in range(50):
        f = np.concatenate(([0.0], np.cumsum(rng.uniform(0.0, 1.0, 12)) + rng.uniform(0, 3)))
        g = _concave_floor(f)
        assert g[0] == 0 and np.all(g <= f + 1e-12) and np.all(np.diff(g, 2) <= 1e-12) and np.all(np.diff(g) >= -1e-12)
    concave = np.array([0.0, 3.0, 5.0, 6.5, 7.5, 8.0])
    assert np.allclose(_concave_floor(concave), concave)


@pytest.mark.parametrize("seed", range(6))
def test_capped_conjugate_majorises_every_run(seed, tmp_path):
    """The batch of each step of every simulated run, sorted, has partial sums at most the
    capped conjugate's (Gale-Ryser), for every batch limit and order."""
    problem, rng = _instance(seed, tmp_path)
    news = [rng.randint(1, 9) for _ in range(rng.randint(2, 5))]
    for cap in range(1, len(news) + 1):
        ref = np.cumsum(capped_conjugate(np.array(news), cap))
        for order in set(itertools.permutations(news)):
            # a run at batch limit cap in this admission order, step by step
            left, active, batch = list(order), [], []
            while left or active:
                while left and len(active) < cap:
                    active.append(left.pop(0))
                batch.append(len(active))
                active = [a - 1 for a in active if a > 1]
            run = np.cumsum(sorted(batch, reverse=True))
            k = min(len(run), len(ref))
            assert np.all(run[:k] <= ref[:k]) and run[-1] == ref[-1] == sum(news)


@pytest.mark.parametrize("seed", range(6))
def test_optimistic_points_dominate_every_schedule_and_resolution_is_exact(seed, tmp_path):
    """For every column of up to 4 sessions and several makespan limits T: each schedule ending
    by T is dominated by an optimistic point of its column (no larger makespan, no fewer on
    time), and the order search's front equals the exhaustive front."""
    problem, _ = _instance(seed, tmp_path)
    perf = PerfModel(problem)
    opts = layout_options(problem, perf, problem.layouts)
    checked = 0
    for lay, opt in opts.items():
        caps = [min(c.count, opt.cap[c.index]) for c in problem.classes]
        for counts in itertools.product(*[range(k + 1) for k in caps]):
            if not 0 < sum(counts) <= 4:
                continue
            sess = [(c.context, c.new) for c in problem.classes for _ in range(counts[c.index])]
            if lay.attention_dp == 1 and perf.model.memory_per_gpu(lay, sess) > problem.gpu.memory_bytes * (1 + 1e-12):
                continue
            every = _every_schedule(problem, perf, lay, counts)
            if not every:
                continue
            loads = sorted(c.load for c in every)
            for t_max in (math.inf, loads[len(loads) // 2] * 1e-8, loads[0] * 1.02e-8):
                bc = BoundedColumns(problem, perf, opts, None if math.isinf(t_max) else t_max)
                cs = bc.enumerate(lay)
                keys = [tuple(int(x) for x in r) for r in cs.counts]
                pts = [(int(ld), int(on)) for j, ld, on in zip(cs.column, cs.load, cs.on_time) if keys[j] == tuple(counts)]
                limit = math.inf if math.isinf(t_max) else math.ceil(t_max / 1e-8 - 1e-6) + 1
                ending = [c for c in every if c.load <= limit]
                for c in ending:
                    assert any(ld <= c.load and on >= c.on_time for ld, on in pts), (lay, counts, t_max, c)
                    checked += 1
                res = bc.resolve(lay, tuple(counts))
                assert res.exact
                assert _front({(c.load, c.on_time) for c in res.points}) == _front({(c.load, c.on_time) for c in ending})
    assert checked > 0


def test_merged_problem_merges_only_sessions_safe_by_the_limit(tmp_path):
    problem, _ = _instance(3, tmp_path)
    merged = merged_problem(problem, 0.05)
    assert sorted(s.id for s in merged.sessions) == sorted(s.id for s in problem.sessions)
    for c in merged.classes:
        olds = {(s.context, s.new, s.deadline_s) for s in problem.sessions if s.id in c.session_ids}
        assert {(x[0], x[1]) for x in olds} == {(c.context, c.new)}
        if c.deadline_s is not None:
            assert olds == {(c.context, c.new, c.deadline_s)}  # at risk: never merged
        else:
            assert all(d is None or d >= 0.05 for _, _, d in olds)
    assert merged_problem(problem, math.inf) is problem or len(merged_problem(problem, math.inf).classes) == len(problem.classes)


@pytest.mark.parametrize("seed", range(8))
def test_cover_programme_equals_brute_force(seed, tmp_path):
    """Random columns over 3 classes of 1-3 sessions: the programme's best cost key equals the
    best over every multiset of columns covering the sessions within the GPUs."""
    problem, rng = _instance(seed, tmp_path)
    from dataclasses import replace

    from optimizer.deployment.schema import SessionClass

    classes = tuple(SessionClass(i, 1000, 2, None, tuple(f"c{i}/{k}" for k in range(rng.randint(1, 3))))
                    for i in range(3))
    problem = replace(problem, classes=classes)
    n = [c.count for c in classes]
    need = max(1, sum(n) - 2)
    lay = Layout.tp(1)
    cols = []
    for counts in itertools.product(*[range(k + 1) for k in n]):
        if sum(counts):
            for _ in range(rng.randint(0, 2)):
                cols.append(Optimistic(rng.choice([1, 2, 4]), counts, rng.randint(10, 30),
                                       sum(counts) - rng.randint(0, min(1, sum(counts))), lay))
    pool = ColumnPool()
    for c in cols:
        pool.add(c)
    pool.settle()
    G = problem.total_gpus
    key, plan = CoverDP(problem, need).run(pool, "cost")
    best = None
    live = [pool.items[i] for i in pool.live()]

    def rec(rem, gpus, mk, on, start):
        nonlocal best
        if not any(rem):
            if on >= need:
                k = Fraction(G * mk, on)
                best = k if best is None or k < best else best
            return
        for j in range(start, len(live)):
            c = live[j]
            if gpus + c.degree <= G and all(a <= r for a, r in zip(c.counts, rem)):
                rec(tuple(r - a for r, a in zip(rem, c.counts)), gpus + c.degree, max(mk, c.load), on + c.on_time, j)

    rec(tuple(n), 0, 0, 0, 0)
    assert key == best
    if plan is not None:
        assert [sum(c.counts[i] * r for c, r in plan) for i in range(3)] == n
        assert sum(c.degree * r for c, r in plan) <= G


def test_the_issue_moe_case_is_proven_optimal(tmp_path):
    """Issue #25 item 3: Qwen3-30B-A3B on one HGX H100, 16 sessions in 8 classes of 2,
    max_batch 16, 75 % on time, cost: proven optimal over every batch limit and admission order
    (the anytime search alone stopped at 0.322 with a bound of 0.164); the plan keeps a
    tight-deadline session in a replica of its own batch limit."""
    import yaml

    from benchmarks.bench_exactness import moe16_raw
    from optimizer.deployment.api import load
    from optimizer.deployment.strategy import solve_deployment
    from optimizer.result import Status

    path = tmp_path / "moe16.yaml"
    path.write_text(yaml.safe_dump(moe16_raw(0)))
    out = solve_deployment(load(path), "cost", time_limit_s=30)  # ends when proven (~5 s alone)
    assert out.status == Status.OPTIMAL and out.scope == ""
    assert "bounded columns" in out.bound_method
    assert out.value == pytest.approx(0.30991, abs=5e-5)
    assert out.evaluation.violations == [] and out.evaluation.nominal.on_time == 16


@pytest.mark.parametrize("seed", range(12))
def test_bounded_solve_equals_the_exhaustive_optimum_with_repeated_sessions(seed, tmp_path):
    """Whole solves on random instances whose classes hold two sessions each (the merged
    classes, repeats in columns and the cover programme's multiplicities all come into play),
    dense or MoE, threshold objectives: the value equals the exhaustive optimum over every
    partition, layout, batch limit and admission order."""
    from tests.deploy_helpers import assert_solver_equals_brute_force

    rng = random.Random(1000 + seed)
    moe = seed % 2 == 1
    cfg = tmp_path / ("moe.json" if moe else "tiny.json")
    cfg.write_text(json.dumps(TINY_MOE if moe else TINY))
    sessions = [{"name": f"s{i}", "count": 2, "context_tokens": rng.randrange(2000, 40000, 1000),
                 "new_tokens": rng.randint(2, 7), "deadline_ms": rng.choice([None, round(rng.uniform(10, 140), 1)])}
                for i in range(rng.choice([2, 3]))]
    layouts = [{"attention": {"tp": 1}}, {"attention": {"tp": 2}}, {"attention": {"tp": 1, "dp": 2}}]
    if moe:
        layouts.append({"attention": {"tp": 1, "dp": 2}, "experts": {"tp": 1, "ep": 2}})
    raw = {"name": f"repeats {seed}", "model": {"config": str(cfg)},
           "hardware": {"gpu": {"name": "small", "memory_gb": rng.choice([0.3, 0.5]), "memory_bandwidth_gb_s": 10.0,
                                "bf16_tflops": 50.0, "power_w": 300.0, "dollars_per_gpu_hour": 2.5},
                        "server": {"name": "box", "gpus": rng.choice([2, 4]), "power_kw": 2.0,
                                   "scale_up": {"bandwidth_gb_s": 50.0, "latency_us": 20.0},
                                   "scale_out": {"bandwidth_gb_s": 5.0, "latency_us": 60.0}}, "servers": 1},
           "performance": {"source": "chapter"},
           "workload": {"sessions": sessions, "min_on_time_fraction": rng.choice([0.0, 0.5, 0.75, 1.0])},
           "deployment": {"reserve_gib_per_gpu": 0.01, "layouts": rng.sample(layouts, rng.randint(2, len(layouts))),
                          "max_batch": rng.randint(2, 4)}}
    problem = build_problem(raw, tmp_path / "repeats.yaml")
    out = assert_solver_equals_brute_force(problem, ["cost", "makespan", "energy"][seed % 3], abs_tol=1e-12)
    assert out.scope == ""
