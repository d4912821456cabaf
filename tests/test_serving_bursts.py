"""Sizing on the trace given (issue #27 item 1): bursty arrivals get the capacity their own
simulation asks for, and `infeasible` only when the GPUs given cannot meet the target."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

import optimizer.serving as serving
from objectives.serving import registry
from optimizer.serving.bursts import compress_bursts, fluid_margin, lindley_waits, poisson_bursts, scv
from optimizer.serving.perf import ServingModel
from optimizer.serving.simulate import simulate
from optimizer.serving.solve import solve_mode
from tests.serving_helpers import INSTANCES, problem

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "serving" / "azure-llm-2023" / \
    "AzureLLMInferenceTrace_conv.csv"


def test_lindley_waits_golden():
    """Arrivals 0, 1, 1.5, 5 with service 2, 2, 2, 1 s: waits 0, 1, 2.5, 1 (a FIFO server by hand)."""
    w = lindley_waits(np.array([0.0, 1.0, 1.5, 5.0]), np.array([2.0, 2.0, 2.0, 1.0]))
    assert w.tolist() == pytest.approx([0.0, 1.0, 2.5, 1.0])


def test_fluid_margin_meets_its_own_wait_and_is_the_least_within_one_percent():
    t = poisson_bursts(0.2, 20, 600, seed=3)
    isl = np.full(len(t), 1000.0)
    rate = (len(t) - 1) / t[-1]
    m = fluid_margin(t, isl, rate, 1.0, 0.9)
    assert m > 2  # 20 requests at once against a 1 s wait ask far above the mean rate

    def q90(f):
        return np.quantile(lindley_waits(t, isl / isl.mean() / (f * rate)), 0.9)

    assert q90(m) <= 1.0 < q90(m / 1.02)
    # Poisson arrivals at a 1 s wait with mean service 1/rate already pass
    tp = np.cumsum(np.random.default_rng(1).exponential(1.0, 5000))
    assert fluid_margin(tp, np.full(5000, 10.0), 1.0 / 0.5, 1.0, 0.9) == 1.0


def test_compress_bursts_keeps_requests_and_mean_rate_and_raises_burstiness():
    t = np.cumsum(np.random.default_rng(2).exponential(0.2, 20_000))
    c = compress_bursts(t, 60.0, 0.1)
    assert len(c) == len(t) and np.all(np.diff(c) >= 0)
    assert abs(c[-1] - t[-1]) < 60.0
    assert np.all(np.mod(c, 60.0) <= 6.0 + 1e-9)
    assert scv(t) == pytest.approx(1.0, abs=0.05) and scv(c) > 5


def _write_trace(tmp_path: Path, t: np.ndarray, isl: int, osl: int) -> Path:
    f = tmp_path / "bursty.csv"
    f.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{a:.6f},{isl},{osl}\n" for a in t))
    return f


def _raw(trace: Path, servers: int, mode: str = "aggregated", config: str = "llama-3.1-70b.json") -> dict:
    return {"name": "bursty", "model": {"config": str(INSTANCES / "models" / config)},
            "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": servers},
            "performance": {"source": "chapter"},
            "serving": {"traffic": {"trace": str(trace)},
                        "slo": {"ttft_ms": 1000, "tpot_ms": 50, "percentile": 90, "attainment": 0.9},
                        "mode": mode, "objective": "gpus"}}


@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_poisson_bursts_of_50_get_a_plan_that_meets_the_target_in_simulation(tmp_path, mode):
    """Bursts of 50 requests at Poisson instants (0.05/s, 2.5 req/s on average). The Poisson-sized plan
    misses badly and twice its capacity still misses (the old repair's limit); the sizing on the
    trace keeps adding capacity and its plan's simulated attainment meets 90 %."""
    t = poisson_bursts(0.05, 50, 1200, seed=7)
    p = problem(_raw(_write_trace(tmp_path, t, 2048, 128), 8, mode))
    workers = ServingModel(p).workers()
    rate = p.rates[0]
    gpus = registry()["gpus"]
    for margin in (1.0, 2.0):
        r = solve_mode(p, workers, mode, gpus, rate * margin)
        assert simulate(p, workers, r.counts, mode, rate).attainment < 0.9  # the Poisson sizing and 2x miss
    rep = serving.solve_instance(p)
    d = rep.to_dict()
    m = d["plan"]["rates"][0]["modes"][mode]
    assert d["status"] == "feasible" and m["simulated"]["attainment"] >= 0.9
    assert m["simulated"]["requests"] >= 0.85 * len(t)  # the whole trace replayed (less the warm-up)
    assert m["capacity_margin"] > 2.0 and m["gpus"] <= 64
    # the independent evaluator agrees on the plan returned
    counts = rep.results[0].plans[mode].result.counts
    assert simulate(p, list(rep.workers), counts, mode, rate).attainment == pytest.approx(m["simulated"]["attainment"])


def _all_plans(workers, role, gpus):
    """Every count vector of ``role``'s usable configurations within ``gpus`` GPUs (at least one worker)."""
    idx = [j for j, w in enumerate(workers) if w.role == role and w.rate > 0]
    ranges = [range(gpus // workers[j].gpus + 1) for j in idx]
    for ns in itertools.product(*ranges):
        if 0 < sum(n * workers[j].gpus for n, j in zip(ns, idx)) <= gpus:
            yield {j: n for j, n in zip(idx, ns) if n}


@pytest.mark.parametrize("seed,burst", [(11, 10), (12, 20), (13, 40), (14, 80)])
def test_infeasible_only_when_no_plan_on_the_gpus_given_meets_the_target(tmp_path, seed, burst):
    """Exhaustive check on one 8-GPU server (Llama-3.1-70B, 2,048-token prompts in bursts of 10 to
    80 spread over 2 s): every aggregated plan that fits is simulated. The solver answers
    infeasible exactly when none meets the target (bursts of 80), and otherwise returns a plan
    that does. The sizing is a search, not a proof of the fewest GPUs; on these four cases it
    found the enumeration's least (2, 4 and 6 GPUs), measured and asserted."""
    t = poisson_bursts(0.02, burst, 1500, seed=seed, spread_s=2.0)
    p = problem(_raw(_write_trace(tmp_path, t, 2048, 96), 1, "aggregated"))
    workers = ServingModel(p).workers()
    rate = p.rates[0]
    passing = [sum(workers[j].gpus * n for j, n in c.items()) for c in _all_plans(workers, "aggregated", 8)
               if simulate(p, workers, c, "aggregated", rate).attainment >= 0.9]
    d = serving.solve_instance(p).to_dict()
    if not passing:
        assert burst == 80 and d["status"] == "infeasible"
        detail = d["conflicts"][0]["details"][0]
        assert "best simulated attainment reached" in detail and "most capacity the GPUs given hold" in detail
    else:
        m = d["plan"]["rates"][0]["modes"]["aggregated"]
        assert d["status"] in ("feasible", "optimal")
        assert m["simulated"]["attainment"] >= 0.9 and m["gpus"] == min(passing)


@pytest.mark.skipif(not SHARED.exists(), reason="../shared (Azure conversation trace) is absent")
def test_the_azure_conversation_trace_compressed_into_bursts_gets_a_plan_on_the_gpus_given(tmp_path):
    """Issue #27 acceptance: the Azure conversation trace (19,366 requests over an hour) with every
    minute's arrivals squeezed into its first 6 s (compress_bursts(t, 60, 0.1): inter-arrival SCV
    1.2 -> about 270), Llama-3.1-70B on 8 HGX H100, TTFT 1 s / TPOT 50 ms at p90 for 90 %. It was
    infeasible (4 GPUs sized for Poisson, 2x tried); now a plan whose simulated attainment meets
    the target, on the 64 GPUs given."""
    import pandas as pd

    d = pd.read_csv(SHARED)
    s = (pd.to_datetime(d.TIMESTAMP) - pd.to_datetime(d.TIMESTAMP).min()).dt.total_seconds().to_numpy()
    c = compress_bursts(s, 60.0, 0.1)
    order = np.argsort(c, kind="stable")
    f = tmp_path / "azure_bursty.csv"
    rows = zip(c[order], d.ContextTokens.to_numpy()[order], d.GeneratedTokens.to_numpy()[order])
    f.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{a:.6f},{i},{o}\n" for a, i, o in rows))
    assert scv(np.sort(c)) > 100
    p = problem(_raw(f, 8, "both"))
    out = serving.solve_instance(p).to_dict()
    best = out["plan"]["rates"][0]["modes"][out["plan"]["rates"][0]["best_mode"]]
    assert out["status"] == "feasible"
    assert best["simulated"]["attainment"] >= 0.9 and best["gpus"] <= 64
