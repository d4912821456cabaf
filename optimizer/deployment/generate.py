"""Seeded, reproducible deployment instances (raw instance-file dicts) for tests and benchmarks.

Sessions are drawn from a few session types (context, new tokens, deadline) so that
identical sessions group into classes, as they do in real traffic; deadlines are set from
the chapter's TP2 service time of each type times a random slack, so that some sessions
need a fast (wide) instance and others fit a narrow one.
"""
from __future__ import annotations

import math
import random
from pathlib import Path

import yaml

from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import build_problem

ROOT = Path(__file__).resolve().parents[2]
# the Azure conversation trace under the shared data folder (``../shared/data`` beside the checkout)
AZURE_CONV = "serving/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
CONTEXTS = (4_096, 16_384, 32_768, 65_536, 131_008)  # context + new tokens <= 131,072 (YaRN x4)
NEW_TOKENS = (8, 16, 32, 64)


def generate(n_sessions: int, servers: int, seed: int = 0, types: int = 6) -> dict:
    rng = random.Random(seed)
    base = {
        "name": f"generated: {n_sessions} sessions on {servers} HGX H100 (seed {seed})",
        # YaRN x4 as Qwen documents for 131,072 tokens (the generated contexts reach 128K)
        "model": {"config": str(ROOT / "instances" / "models" / "qwen3-32b.json"),
                  "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}},
        "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": servers},
        "performance": {"source": "chapter"},  # the scale corpus: the roofline its benchmark figures were measured on
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
        "performance": {"source": "chapter"},  # the scale corpus: the roofline its benchmark figures were measured on
        "workload": {"sessions": [{"name": f"k{i}", "count": c, "context_tokens": k[0], "new_tokens": k[1],
                                   "deadline_ms": k[2]} for i, (k, c) in enumerate(zip(kinds, counts))],
                     "min_on_time_fraction": 1.0},
        "deployment": {"reserve_gib_per_gpu": 2},
    }


def _qwen32b_base(name: str, servers: int, fraction: float, max_batch) -> dict:
    dep = {"reserve_gib_per_gpu": 2, "tensor_parallel": [1, 2, 4, 8]}
    if max_batch is not None:
        dep["max_batch"] = max_batch
    return {
        "name": name,
        "model": {"config": str(ROOT / "instances" / "models" / "qwen3-32b.json"),
                  "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}},
        "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": servers},
        "performance": {"source": "chapter"},  # the scale corpus: the roofline its benchmark figures were measured on
        "workload": {"sessions": [], "min_on_time_fraction": fraction},
        "deployment": dep,
    }


def generate_mixed(n_sessions: int = 200, servers: int = 16, seed: int = 0, types: int | None = None,
                   fraction: float = 0.8, max_batch=1) -> dict:
    """Traffic that does not come in a few neat classes: Qwen3-32B on ``servers`` HGX H100,
    ``n_sessions`` sessions whose context (log-uniform 4K-128K tokens), new tokens (log-uniform
    8-128) and deadline (log-uniform from max(200 ms, 1.2 x the session's TP8 service time) to
    3 s, so that every session can be on time alone) are drawn per session (``types`` None: every
    session its own mix) or per type (``types`` session types, counts drawn uniformly).
    ``fraction`` of the sessions must be on time; ``max_batch`` 1 (one session at a time) or
    None (default batching, no limit beyond memory)."""
    rng = random.Random(seed)
    probe = build_problem({**_qwen32b_base("probe", servers, fraction, max_batch),
                           "workload": {"sessions": [{"name": "p", "context_tokens": 1, "new_tokens": 1}]}},
                          ROOT / "benchmarks" / "generated.yaml")
    perf = PerfModel(probe)

    def draw():
        ctx = int(round(math.exp(rng.uniform(math.log(4_096), math.log(131_000)))))
        new = int(round(math.exp(rng.uniform(math.log(8), math.log(128)))))
        lo = max(200.0, 1.2 * perf.service_time_s(8, ctx, new) * 1e3)  # reachable alone on TP8
        dl = round(math.exp(rng.uniform(math.log(lo), math.log(max(lo, 3000.0)))), 1)
        return ctx, new, dl

    what = f"{types} types" if types else "distinct"
    base = _qwen32b_base(f"generated mixed: {n_sessions} {what} sessions on {servers} HGX H100 (seed {seed}, "
                         f"max_batch {max_batch or 'unlimited'})", servers, fraction, max_batch)
    if types:
        kinds = [draw() for _ in range(types)]
        counts = [0] * types
        for _ in range(n_sessions):
            counts[rng.randrange(types)] += 1
        groups = [(f"type{t}", c, k) for t, (k, c) in enumerate(zip(kinds, counts)) if c]
    else:
        groups = [(f"s{i}", 1, draw()) for i in range(n_sessions)]
    base["workload"]["sessions"] = [{"name": nm, "count": c, "context_tokens": k[0], "new_tokens": k[1],
                                     "deadline_ms": k[2]} for nm, c, k in groups]
    return base


def generate_azure(csv_path, n_sessions: int = 5000, servers: int = 64, fraction: float = 0.8,
                   max_batch=1) -> dict:
    """The first ``n_sessions`` requests of the Azure LLM inference trace (conversation):
    each decodes ``GeneratedTokens`` after ``ContextTokens`` already in the KV cache.
    Deadline rule: 2 s plus 100 ms per generated token (a 100 ms TPOT target after a 2 s start)."""
    import csv

    base = _qwen32b_base(f"Azure conversation trace, first {n_sessions} requests on {servers} HGX H100 "
                         f"(max_batch {max_batch or 'unlimited'})", servers, fraction, max_batch)
    groups: dict[tuple, int] = {}
    with open(csv_path, newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            if i >= n_sessions:
                break
            ctx, new = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            key = (ctx, new, 2000.0 + 100.0 * new)
            groups[key] = groups.get(key, 0) + 1
    base["workload"]["sessions"] = [{"name": f"r{i}", "count": c, "context_tokens": k[0], "new_tokens": k[1],
                                     "deadline_ms": k[2]} for i, (k, c) in enumerate(groups.items())]
    return base


def generate_short(n_sessions: int = 200, servers: int = 16, seed: int = 0, fraction: float = 0.8,
                   max_batch=None) -> dict:
    """A second length mix and deadline rule (issue #25: the anytime search on generators other
    than :func:`generate_mixed`): contexts log-uniform 1K-32K tokens, new tokens log-uniform
    16-512, deadline = the session's TP8 service time alone x uniform(1.5, 6), at least 300 ms;
    every session its own triple."""
    rng = random.Random(seed)
    base = _qwen32b_base(f"generated short: {n_sessions} distinct sessions on {servers} HGX H100 (seed {seed})",
                         servers, fraction, max_batch)
    perf = PerfModel(build_problem({**base, "workload": {"sessions": [{"name": "p", "context_tokens": 1,
                                                                      "new_tokens": 1}]}},
                                   ROOT / "benchmarks" / "generated.yaml"))
    out = []
    for i in range(n_sessions):
        ctx = int(round(math.exp(rng.uniform(math.log(1_024), math.log(32_768)))))
        new = int(round(math.exp(rng.uniform(math.log(16), math.log(512)))))
        dl = round(max(300.0, perf.service_time_s(8, ctx, new) * 1e3 * rng.uniform(1.5, 6.0)), 1)
        out.append({"name": f"s{i}", "count": 1, "context_tokens": ctx, "new_tokens": new, "deadline_ms": dl})
    base["workload"]["sessions"] = out
    return base


def generate_bimodal(n_sessions: int = 200, servers: int = 16, seed: int = 0, fraction: float = 0.8,
                     max_batch=None) -> dict:
    """A third mix (issue #25): 70% chat turns (contexts uniform 1K-8K, 64-512 new tokens) and 30%
    long-document questions (contexts uniform 32K-128K, 8-64 new tokens); deadline by a TPOT-style
    rule, 2 s + 40 ms per new token; every session its own triple."""
    rng = random.Random(seed)
    base = _qwen32b_base(f"generated bimodal: {n_sessions} distinct sessions on {servers} HGX H100 (seed {seed})",
                         servers, fraction, max_batch)
    out = []
    for i in range(n_sessions):
        if rng.random() < 0.7:
            ctx, new = rng.randint(1_024, 8_192), rng.randint(64, 512)
        else:
            ctx, new = rng.randint(32_768, 131_000), rng.randint(8, 64)
        out.append({"name": f"s{i}", "count": 1, "context_tokens": ctx, "new_tokens": new,
                    "deadline_ms": 2000.0 + 40.0 * new})
    base["workload"]["sessions"] = out
    return base
