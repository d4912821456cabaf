"""Generated deployment traffic at scale and a fresh-process CLI run, for the tests.

The generators draw exactly what ``benchmarks/gen_deployment.py`` draws (same seeds, same
instances: the tests' docstrings quote figures of those cases); they live here so that tests
do not import benchmark code. Timing figures (first plan, wall time, gap at 60 s) are the
benchmarks' business (``benchmarks/bench_deployment.py``), not the tests'.
"""
from __future__ import annotations

import csv
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import yaml

from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import build_problem

ROOT = Path(__file__).resolve().parents[1]
AZURE_CONV = "serving/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"


def _qwen32b_base(name: str, servers: int, fraction: float, max_batch) -> dict:
    dep = {"reserve_gib_per_gpu": 2, "tensor_parallel": [1, 2, 4, 8]}
    if max_batch is not None:
        dep["max_batch"] = max_batch
    return {
        "name": name,
        "model": {"config": str(ROOT / "instances" / "models" / "qwen3-32b.json"),
                  "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}},
        "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": servers},
        "workload": {"sessions": [], "min_on_time_fraction": fraction},
        "deployment": dep,
    }


def generate_mixed(n_sessions: int = 200, servers: int = 16, seed: int = 0, types: int | None = None,
                   fraction: float = 0.8, max_batch=1) -> dict:
    """Qwen3-32B on ``servers`` HGX H100, ``n_sessions`` sessions whose context (log-uniform
    4K-128K tokens), new tokens (log-uniform 8-128) and deadline (log-uniform from max(200 ms,
    1.2 x the session's TP8 service time) to 3 s) are drawn per session (``types`` None) or per
    type; ``fraction`` of them on time; ``max_batch`` 1 or None (default batching)."""
    rng = random.Random(seed)
    probe = build_problem({**_qwen32b_base("probe", servers, fraction, max_batch),
                           "workload": {"sessions": [{"name": "p", "context_tokens": 1, "new_tokens": 1}]}},
                          ROOT / "tests" / "generated.yaml")
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


def generate(n_sessions: int, servers: int, seed: int = 0, types: int = 6) -> dict:
    """Sessions drawn from ``types`` session types (context, new tokens, deadline from the TP2
    service time times a random slack), one at a time, 90 % on time."""
    contexts = [4_096, 16_384, 32_768, 65_536, 131_008]
    new_tokens = [8, 16, 32, 64]
    rng = random.Random(seed)
    base = {
        "name": f"generated: {n_sessions} sessions on {servers} HGX H100 (seed {seed})",
        "model": {"config": str(ROOT / "instances" / "models" / "qwen3-32b.json"),
                  "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}},
        "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": servers},
        "workload": {"sessions": [], "min_on_time_fraction": 0.9},
        "deployment": {"reserve_gib_per_gpu": 2, "tensor_parallel": [1, 2, 4, 8], "max_batch": 1},
    }
    probe = build_problem({**base, "workload": {"sessions": [{"name": "p", "context_tokens": 1, "new_tokens": 1}]}},
                          ROOT / "tests" / "generated.yaml")
    perf = PerfModel(probe)
    kinds = []
    for _ in range(types):
        ctx, new = rng.choice(contexts), rng.choice(new_tokens)
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


def generate_azure(csv_path, n_sessions: int = 5000, servers: int = 64, fraction: float = 0.8,
                   max_batch=1) -> dict:
    """The first ``n_sessions`` requests of the Azure LLM inference trace (conversation), deadline
    2 s plus 100 ms per generated token."""
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


def write(raw: dict, folder: Path, name: str = "case.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_cli_process(*args, timeout: float = 300) -> tuple[int, dict | None, str]:
    """``optimize ARGS --format json`` in a fresh process, as a user runs it: (exit code, the
    JSON envelope or None, stderr). No wall time: timing is the benchmarks' business."""
    r = subprocess.run([sys.executable, "-m", "optimizer.cli", *map(str, args), "--format", "json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    d = json.loads(r.stdout) if r.stdout.strip().startswith("{") else None
    return r.returncode, d, r.stderr
