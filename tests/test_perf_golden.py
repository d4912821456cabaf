"""Golden values of the reference chapter (issue #2, section 3) for Qwen3-32B on H100.

Tolerances: one unit in the last quoted digit (e.g. ±0.005 ms for "29.35 ms").
"""
from __future__ import annotations

import pytest

from optimizer.model.collectives import ring_allreduce_s, tree_allreduce_s
from optimizer.deployment.perf import PerfModel, kv_bytes_per_token, weight_bytes
from tests.deploy_helpers import book_problem

CTX, NEW = 131064, 8


@pytest.fixture(scope="module")
def perf():
    return PerfModel(book_problem())


def test_bytes(perf):
    assert perf.w.per_layer / 2 ** 20 == pytest.approx(930, abs=0.5)
    assert perf.w.read_per_step / 1e9 == pytest.approx(63.97, abs=0.005)
    assert perf.w.resident / 1e9 == pytest.approx(65.52, abs=0.005)
    assert perf.kv_token == 256 * 1024


def test_attention_and_ffn_formulas():
    m = book_problem().model
    w = weight_bytes(m, 2)
    assert w.attention_per_layer == 2 * (2 * 5120 * 64 * 128 + 2 * 5120 * 8 * 128)
    assert w.ffn_per_layer == 3 * 5120 * 25600 * 2
    assert w.lm_head == 151936 * 5120 * 2
    assert kv_bytes_per_token(m, 1) == 128 * 1024  # fp8 KV halves it


def test_allreduce_tp8():
    assert ring_allreduce_s(8, 5120 * 2, 0.822e-6, 450e9) * 1e6 == pytest.approx(11.55, abs=0.005)
    assert tree_allreduce_s(8, 5120 * 2, 0.822e-6, 450e9) * 1e6 == pytest.approx(5.07, abs=0.005)
    assert ring_allreduce_s(1, 10240, 1e-6, 1e9) == 0.0


@pytest.mark.parametrize("p,ms", [(1, 29.35), (2, 14.89), (4, 7.97), (8, 5.15)])
def test_step_time(perf, p, ms):
    assert perf.step_time_s(p, CTX) * 1e3 == pytest.approx(ms, abs=0.005)


@pytest.mark.parametrize("p,ms", [(2, 119.1), (4, 63.8), (8, 41.2)])
def test_service_time(perf, p, ms):
    assert perf.service_time_s(p, CTX, NEW) * 1e3 == pytest.approx(ms, abs=0.05)


@pytest.mark.parametrize("p,n,gb", [(1, 1, 102.03), (2, 1, 52.09), (4, 2, 35.71), (8, 4, 27.52)])
def test_memory_per_gpu(perf, p, n, gb):
    assert perf.memory_per_gpu(p, [(CTX, NEW)] * n) / 1e9 == pytest.approx(gb, abs=0.005)


@pytest.mark.parametrize("p,n", [(1, 0), (2, 2), (4, 7), (8, 16)])
def test_max_sessions(perf, p, n):
    assert perf.max_sessions(p, CTX, NEW) == n


def test_tree_and_best_modes():
    tree = PerfModel(book_problem(deployment__allreduce="tree"))
    best = PerfModel(book_problem(deployment__allreduce="best"))
    assert tree.allreduce_s(8) * 1e6 == pytest.approx(5.07, abs=0.005)
    assert best.allreduce_s(8) == min(tree.allreduce_s(8), PerfModel(book_problem()).allreduce_s(8))
    # p = 2: ring 2α + M/B beats tree 2(α + M/B)
    assert best.allreduce_s(2) == PerfModel(book_problem()).allreduce_s(2)


def test_kv_replicated_beyond_kv_heads(perf):
    # TP16 > KVH=8: KV per GPU stops shrinking
    assert perf.kv_bytes_per_gpu(16, CTX, NEW) == perf.kv_bytes_per_gpu(8, CTX, NEW)
