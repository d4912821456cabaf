"""Generate heterogeneous deployment instances for the benchmarks (seeded, reproducible).

Sessions are drawn from a few session types (context, new tokens, deadline) so that
identical sessions group into classes, as they do in real traffic; deadlines are set from
the chapter's TP2 service time of each type times a random slack, so that some sessions
need a fast (wide) instance and others fit a narrow one.
"""
from __future__ import annotations

import random
from pathlib import Path

import yaml

from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import build_problem

ROOT = Path(__file__).resolve().parents[1]
CONTEXTS = [4_096, 16_384, 32_768, 65_536, 131_008]  # context + new tokens <= 131,072 (YaRN x4)
NEW_TOKENS = [8, 16, 32, 64]


def generate(n_sessions: int, servers: int, seed: int = 0, types: int = 6) -> dict:
    rng = random.Random(seed)
    base = {
        "name": f"generated: {n_sessions} sessions on {servers} HGX H100 (seed {seed})",
        # YaRN x4 as Qwen documents for 131,072 tokens (the generated contexts reach 128K)
        "model": {"config": str(ROOT / "instances" / "models" / "qwen3-32b.json"),
                  "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}},
        "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": servers},
        "workload": {"sessions": [], "min_on_time_fraction": 0.9},
        "deployment": {"reserve_gib_per_gpu": 2, "tensor_parallel": [1, 2, 4, 8], "max_batch": 1},
    }
    probe = build_problem({**base, "workload": {"sessions": [{"name": "p", "context_tokens": 1, "new_tokens": 1}]}},
                          ROOT / "benchmarks" / "generated.yaml")
    perf = PerfModel(probe)
    kinds = []
    for t in range(types):
        ctx, new = rng.choice(CONTEXTS), rng.choice(NEW_TOKENS)
        tp2 = perf.service_time_s(2, ctx, new) * 1e3
        kinds.append((ctx, new, round(tp2 * rng.uniform(1.2, 4.0), 1)))
    counts = [0] * types
    for _ in range(n_sessions):
        counts[rng.randrange(types)] += 1
    for t, (ctx, new, dl) in enumerate(kinds):
        if counts[t]:
            base["workload"]["sessions"].append({"name": f"type{t}", "count": counts[t], "context_tokens": ctx,
                                                 "new_tokens": new, "deadline_ms": dl})
    return base


if __name__ == "__main__":
    import sys

    n, s = int(sys.argv[1]), int(sys.argv[2])
    print(yaml.safe_dump(generate(n, s), sort_keys=False))


def generate_batched(n_sessions: int = 24, servers: int = 2, seed: int = 0) -> dict:
    """A batched-decode instance: Qwen3-32B on ``servers`` HGX H100, ``n_sessions`` sessions of
    three mixed lengths (4K/256, 16K/128, 32K/64 tokens of context/new tokens, counts drawn
    with ``seed``), deadlines 3.0 / 2.5 / 2.0 s, default layouts and no batch limit beyond memory."""
    rng = random.Random(seed)
    kinds = [(4_096, 256, 3000.0), (16_384, 128, 2500.0), (32_768, 64, 2000.0)]
    counts = [1, 1, 1]
    for _ in range(n_sessions - 3):
        counts[rng.randrange(3)] += 1
    return {
        "name": f"generated batched: {n_sessions} sessions on {servers} HGX H100 (seed {seed})",
        "model": {"config": str(ROOT / "instances" / "models" / "qwen3-32b.json")},
        "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": servers},
        "workload": {"sessions": [{"name": f"k{i}", "count": c, "context_tokens": k[0], "new_tokens": k[1],
                                   "deadline_ms": k[2]} for i, (k, c) in enumerate(zip(kinds, counts))],
                     "min_on_time_fraction": 1.0},
        "deployment": {"reserve_gib_per_gpu": 2},
    }
