"""Benchmark of the expert-placement optimiser (run by hand; figures go into the README).

1. DeepSeek-V3-shaped case: 58 MoE layers, 256 routed experts, 288 physical slots on 32 GPUs
   in 4 nodes, 8 expert groups; per-layer expert popularity lognormal(0, sigma) (seed fixed),
   16384 tokens x top-8 drawn multinomially. All layers through the ``optimize`` code path
   (greedy baseline, optimised plan, bound) with a time limit; reports wall time, mean/max gap,
   balancedness.
2. DeepSeek ESFT routing records (../shared/data/expert_load/esft/{intent,law}, 26 layers x
   64 experts, top-6): EP8 on 2 nodes with 10 slots per GPU (80 replicas), windows of 1024
   tokens; fitted on the first half of the windows, scored on the rest, greedy vs optimised.

The search is limited by work (``--work``: CP-SAT deterministic time per layer), so the plans
and gaps are reproducible; ``--time-limit`` is an optional wall-clock guard (runs it cuts short
are reported as not reproducible).

Usage: ``python benchmarks/bench_experts.py [--work W] [--time-limit S] [--sigma 1.0] [--json out.json]``
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
ESFT = REPO.parent / "shared" / "data" / "expert_load" / "esft"

from optimizer.budget import Budget  # noqa: E402
from optimizer.experts import PIPELINE  # noqa: E402
from optimizer.problems import run_pipeline  # noqa: E402
from optimizer.experts.traces import lognormal_loads  # noqa: E402


v3_loads = lognormal_loads  # the DeepSeek-V3-shaped default draws


def synthetic_trace(seed: int = 2024, layers: int = 4, experts: int = 256, windows: int = 3,
                    tokens: int = 4096, top_k: int = 8) -> dict:
    """The shipped instances/traces/synthetic_v3_ep32.json (vLLM load_history format)."""
    rng = np.random.default_rng(seed)
    base = rng.lognormal(0, 1.0, (layers, experts))
    hist = []
    for _ in range(windows):
        drift = base * rng.lognormal(0, 0.25, (layers, experts))
        hist.append({"logical_expert_load": [rng.multinomial(tokens * top_k, p / p.sum()).tolist() for p in drift]})
    return {"load_history": hist}


def _run(raw: dict, folder: Path, time_limit: float | None, work: float):
    if work is not None:  # else the product's default (optimizer.experts.solve.default_work)
        raw["experts"]["work_units_per_layer"] = work
    path = folder / "inst.yaml"
    path.write_text(yaml.safe_dump(raw))
    t0 = time.perf_counter()
    rep = run_pipeline(PIPELINE, raw, path, "max-load", Budget.for_command(time_limit))
    return rep.to_dict(), time.perf_counter() - t0


def bench_v3(time_limit: float | None, work: float, sigma: float, seed: int) -> dict:
    loads = v3_loads(seed=seed, sigma=sigma)
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "v3.npy").write_bytes(b"")
        np.save(folder / "v3.npy", loads)
        raw = {"name": "v3-shaped", "experts": {"trace": "v3.npy", "num_gpus": 32, "num_nodes": 4, "num_groups": 8,
                                                "slots_per_gpu": 9, "evaluate_windows": "none"}}
        rep, wall = _run(raw, folder, time_limit, work)
    s = rep["plan"]["summary"]
    gaps = [lay["optimized"]["gap"] for lay in rep["plan"]["layers"]]
    greedy_gaps = [lay["greedy"]["gap"] for lay in rep["plan"]["layers"] if lay["greedy"]["gap"] is not None]
    return {"case": f"DeepSeek-V3 shaped (lognormal sigma={sigma}, seed {seed})", "layers": len(gaps),
            "wall_s_total": wall, "solve_s": s["solve_time_s"], "mean_gap": float(np.mean(gaps)),
            "max_gap": float(np.max(gaps)), "greedy_mean_gap_to_bound": float(np.mean(greedy_gaps)),
            "proven_optimal_layers": s["proven_optimal_count"], "reproducible": s["reproducible"],
            "greedy_colocated_layers": len(s["greedy_colocated_layers"]),
            "balancedness": {k: s[k]["mean_balancedness"] for k in ("trivial", "greedy", "optimized")},
            "sum_max_load": {k: s[k]["sum_max_load"] for k in ("trivial", "greedy", "optimized")},
            "optimised_above_greedy_layers": sum(lay["optimized"]["max_load"] > lay["greedy"]["max_load"] + 1e-9
                                                 for lay in rep["plan"]["layers"])}


def bench_esft(task: str, time_limit: float | None, work: float, window_tokens: int = 1024) -> dict | None:
    folder = ESFT / task
    if not folder.exists():
        return None
    raw = {"name": f"esft {task}", "experts": {
        "trace": str(folder), "format": "topk", "num_experts": 64, "window_tokens": window_tokens,
        "num_gpus": 8, "num_nodes": 2, "slots_per_gpu": 10, "fit_windows": "first:4", "evaluate_windows": "rest"}}
    with tempfile.TemporaryDirectory() as d:
        rep, wall = _run(raw, Path(d), time_limit, work)
    s = rep["plan"]["summary"]
    return {"case": f"ESFT {task}: {rep['plan']['trace']['windows']} windows of {window_tokens} tokens, fit 0-3, score 4-end",
            "layers": s["layers"], "wall_s_total": wall, "mean_gap": s["optimized"]["mean_gap"],
            "proven_optimal_layers": s["proven_optimal_count"], "reproducible": s["reproducible"],
            "held_out_windows": s["optimized"]["held_out"]["windows"],
            "fitted_balancedness": {k: s[k]["mean_balancedness"] for k in ("trivial", "greedy", "optimized")},
            "held_out_summed_balancedness": {k: s[k]["held_out"]["summed_mean_balancedness"]
                                             for k in ("trivial", "greedy", "optimized")},
            "held_out_worst_window_balancedness": {k: s[k]["held_out"]["worst_window_mean_balancedness"]
                                                   for k in ("trivial", "greedy", "optimized")},
            "held_out_summed_sum_max_load": {k: s[k]["held_out"]["summed_sum_max_load"]
                                             for k in ("trivial", "greedy", "optimized")}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=float, default=None,
                    help="CP-SAT deterministic time per layer (default: the product's, 3 units over the layers)")
    ap.add_argument("--time-limit", type=float, default=None, help="wall-clock guard (s), none by default")
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    results = [bench_v3(a.time_limit, a.work, a.sigma, a.seed)]
    for task in ("intent", "law"):
        r = bench_esft(task, a.time_limit, a.work)
        if r is not None:
            results.append(r)
        else:
            print(f"skipped ESFT {task}: {ESFT / task} not present")
    for r in results:
        print(json.dumps(r, indent=1))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
