"""Published serving tables against the default step-time source (issue #38 acceptance).

``python -m benchmarks.bench_published [--only ID,...] [--out PATH]``

The rows are NVIDIA's own published figures (``benchmarks/data/published_tables.yaml``, each
table with its source and version): TensorRT-LLM's performance overview (v1.0 text: offline
``trtllm-bench`` maximum throughput, Llama-3.1-8B, Llama-3.3-70B and Qwen3-235B-A22B FP8 on H100
and H200) and NIM's LLM benchmarking page (containers 1.8.0: Llama-3.1-8B and Llama-3.3-70B FP8
on H100 at AIPerf concurrencies 1-250, with TTFT and ITL). Each row a single 8-GPU server
(catalog ``hgx-h100`` / ``hgx-h200``) can hold becomes a serving instance with a fixed plan, as
``optimize fidelity`` builds one from a measured row (:func:`optimizer.serving.fidelity.instance_of`),
and is estimated in-process by :func:`optimizer.serving.estimate.estimate` (the path of
``optimize estimate``) with the DEFAULT performance block: none at all for the NIM rows, and only
``performance.engine: trtllm`` for the TensorRT-LLM table (the engine is part of its question).

The rules, the same for every row (nothing is fitted on the rows):

* Model: the config.json aiconfigurator-core ships (Llama-3.3-70B: the Llama-3.1-70B config, the
  same architecture), ``model.weight_dtype: fp8`` (every row is FP8; per-tensor, the ModelOpt
  checkpoints' scheme), KV cache FP8 for the TensorRT-LLM table (the ModelOpt FP8 checkpoints it
  names carry an FP8 KV scheme, which TensorRT-LLM's ``kv_cache_config.dtype: auto`` takes, as
  its docs say) and BF16 for NIM (its page does not say; BF16 is the engines' ``auto`` without a
  KV scheme). Both dtypes are written out, so the rows do not move with the dtype defaults.
* Layout: the row's TP. Qwen3-235B-A22B ("TP8"): attention DP 8 with experts EP 8 (``DEP8``):
  the page's MoE options enable attention DP and its MoE command passes ``--ep``; the page's later
  version labels the same H100 run DEP8. The other reading, TP8 with the experts split by TP,
  is predicted too and reported beside it (``alternative``), not used for the verdicts.
* Chunk budget 8,192 tokens per step (:data:`optimizer.serving.fidelity.CHUNK_TOKENS`).
* NIM rows: a closed loop at the row's concurrency, exact ISL/OSL, all users starting together,
  10 requests per user (AIPerf's concurrency mode).
* TensorRT-LLM rows (maximum throughput, no concurrency stated): offline, as ``trtllm-bench
  throughput`` runs them: the page's ``$num_requests`` for the ISL/OSL all queued at time 0 (a
  closed loop of that many users sending one request each). The engine admits what its KV cache
  holds at full length (TensorRT-LLM reserves a request's whole length), at most 4,096 at once
  (``serving.max_batch``: trtllm-bench's cap on the batch it sizes from the KV cache,
  ``tensorrt_llm/bench/build/tuning.py``). So the concurrency is the engine's own, not searched.

Compared per row: throughput (output tokens/s of the instance) and, for NIM, TPOT against the
published ITL and TTFT. Targets (issue #38): throughput and TPOT within 15% on every row, TTFT
within 25% at NIM's concurrencies. Prints a markdown table and writes
``benchmarks/results/published.json``.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "published_tables.yaml"
OUT = ROOT / "benchmarks" / "results" / "published.json"
GPUS = {"H100": ("h100-sxm", "hgx-h100"), "H200": ("h200-sxm", "hgx-h200")}
SERVER_GPUS = 8  # one hgx-h100 / hgx-h200
TRTLLM_BENCH_MAX_BATCH = 4096  # trtllm-bench's cap on the max batch it sizes from the KV cache
THROUGHPUT_TARGET, TPOT_TARGET, TTFT_TARGET = 0.15, 0.15, 0.25
# model id in the tables -> aiconfigurator-core model_configs file (same architecture)
CONFIGS = {
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama--Meta-Llama-3.1-8B_config.json",
    "meta/llama-3.1-8b-instruct": "meta-llama--Meta-Llama-3.1-8B_config.json",
    "nvidia/Llama-3.3-70B-Instruct-FP8": "meta-llama--Meta-Llama-3.1-70B_config.json",
    "meta/llama-3.3-70b-instruct": "meta-llama--Meta-Llama-3.1-70B_config.json",
    "nvidia/Qwen3-235B-A22B-FP8": "Qwen--Qwen3-235B-A22B_config.json",
}
SHORT = {"nvidia/Llama-3.1-8B-Instruct-FP8": "Llama-3.1-8B", "meta/llama-3.1-8b-instruct": "Llama-3.1-8B",
         "nvidia/Llama-3.3-70B-Instruct-FP8": "Llama-3.3-70B", "meta/llama-3.3-70b-instruct": "Llama-3.3-70B",
         "nvidia/Qwen3-235B-A22B-FP8": "Qwen3-235B-A22B"}


def load_tables(path: Path = DATA) -> list[dict]:
    return yaml.safe_load(path.read_text())["tables"]


def row_id(table: dict, r: dict) -> str:
    rid = f"{table['id']}:{SHORT[r['model']]}:{r['gpu']}:TP{r['tp']}:{r['isl']}/{r['osl']}"
    return rid + (f":c{r['concurrency']}" if "concurrency" in r else "")


def model_configs() -> Optional[Path]:
    try:
        from importlib.resources import files

        return Path(str(files("aiconfigurator_core") / "model_configs"))
    except ModuleNotFoundError:
        return None


def is_moe(model: str) -> bool:
    return "Qwen3-235B" in model


def workers_of(r: dict, alternative: bool = False) -> list[dict]:
    """The fixed plan: one aggregated worker of the row's layout (see the module docstring)."""
    if is_moe(r["model"]) and not alternative:
        return [{"role": "aggregated", "tp": 1, "dp": r["tp"], "ep": r["tp"], "count": 1}]
    return [{"role": "aggregated", "tp": r["tp"], "count": 1}]


def instance(table: dict, r: dict, alternative: bool = False, nim_kv: str = "bf16",
             nim_start: str = "together") -> tuple[Optional[dict], Optional[int], str]:
    """(raw serving instance, requests to simulate or None for 10 per user, why not) for a row.

    ``nim_kv`` / ``nim_start``: the NIM rows' KV dtype and closed-loop start, kept at the rules'
    BF16 / together except for the diagnostic run (``--diagnose``), whose figures are no verdict."""
    gpus = r.get("gpus", r["tp"])
    if gpus > SERVER_GPUS:
        return None, None, f"{gpus} GPUs: more than one {SERVER_GPUS}-GPU server"
    root = model_configs()
    if root is None:
        return None, None, "aiconfigurator-core is not installed (its model configs and kernel database)"
    gpu, server = GPUS[r["gpu"]]
    trt = table["engine"] == "trtllm"
    traffic = {"isl": r["isl"], "osl": r["osl"]}
    serving = {"slo": {"ttft_ms": 1e6, "tpot_ms": 1e6}, "chunk_tokens": 8192,
               "fixed": {"workers": workers_of(r, alternative)}}
    requests = None
    if "concurrency" in r:
        traffic["concurrency"] = r["concurrency"]
        if nim_start != "together":
            traffic["start"] = nim_start
    else:  # offline maximum throughput: every request of the dataset queued at once
        requests = table["num_requests"][f"{r['isl']}/{r['osl']}"]
        traffic["concurrency"] = requests
        serving["max_batch"] = TRTLLM_BENCH_MAX_BATCH
    serving["traffic"] = traffic
    raw = {"name": row_id(table, r),
           "model": {"config": str(root / CONFIGS[r["model"]]), "hf_id": r["model"],
                     "weight_dtype": r["precision"], "kv_dtype": "fp8" if trt else nim_kv},
           "hardware": {"gpu": gpu, "server": server, "servers": 1},
           "serving": serving}
    if trt:
        raw["performance"] = {"engine": "trtllm"}
    return raw, requests, ""


def predict(raw: dict, requests: Optional[int]) -> dict:
    """Estimate one instance: simulated throughput, TTFT and TPOT means, the source that timed it."""
    from optimizer.errors import take_warnings
    from optimizer.serving import load_problem
    from optimizer.serving.estimate import estimate

    t0 = time.perf_counter()
    try:
        p = load_problem(raw, ROOT / "benchmarks" / "data" / "published_row.yaml")
        e = estimate(p, requests=requests)[0]
    finally:
        warnings = [str(w) for w in take_warnings()]
    s = e.sim
    return {"throughput_tok_s": s.tokens_per_s, "ttft_ms": s.ttft_s["mean"] * 1e3, "tpot_ms": s.tpot_s["mean"] * 1e3,
            "source": p.pools[0].steps.name, "timed_by": p.pools[0].steps.why, "max_batch": e.workers[0].max_batch,
            "layout": e.workers[0].layout.label(), "completed": s.completed, "requests": s.requests,
            "notes": list(e.notes), "warnings": warnings, "time_s": time.perf_counter() - t0}


def rel(pred: Optional[float], pub: Optional[float]) -> Optional[float]:
    return None if pred is None or pub is None else pred / pub - 1


def run_row(table: dict, r: dict, **variant) -> dict:
    from optimizer.errors import InputError

    out = {"id": row_id(table, r), "table": table["id"], "published": {
        k: r[k] for k in ("throughput_tok_s", "ttft_ms", "itl_ms") if k in r}, "row": r}
    raw, requests, why = instance(table, r, **variant)
    if raw is None:
        out["skipped"] = why
        return out
    out["traffic"] = ({"concurrency": r["concurrency"]} if requests is None
                      else {"offline_requests": requests, "max_batch": TRTLLM_BENCH_MAX_BATCH})
    try:
        got = predict(raw, requests)
    except InputError as exc:
        out["skipped"] = exc.problem
        return out
    out["predicted"] = got
    err = {"throughput": rel(got["throughput_tok_s"], r["throughput_tok_s"])}
    if "itl_ms" in r:
        err["tpot"] = rel(got["tpot_ms"], r["itl_ms"])
    if "ttft_ms" in r:
        err["ttft"] = rel(got["ttft_ms"], r["ttft_ms"])
    out["error"] = err
    out["meets"] = {"throughput": abs(err["throughput"]) <= THROUGHPUT_TARGET,
                    **({"tpot": abs(err["tpot"]) <= TPOT_TARGET} if "tpot" in err else {}),
                    **({"ttft": abs(err["ttft"]) <= TTFT_TARGET} if "ttft" in err else {})}
    if is_moe(r["model"]):  # the other reading of "TP8": experts split by TP (reported, not judged)
        raw2, req2, _ = instance(table, r, alternative=True)
        try:
            alt = predict(raw2, req2)
            out["alternative"] = {"layout": alt["layout"], "throughput_tok_s": alt["throughput_tok_s"],
                                  "error": rel(alt["throughput_tok_s"], r["throughput_tok_s"]),
                                  "max_batch": alt["max_batch"], "source": alt["source"]}
        except InputError as exc:
            out["alternative"] = {"skipped": exc.problem}
    return out


def pct(x: Optional[float]) -> str:
    return "" if x is None else f"{x * 100:+.0f}%"


def num(x: Optional[float], digits: int = 0) -> str:
    return "" if x is None else f"{x:,.{digits}f}"


def markdown(results: list[dict]) -> str:
    lines = ["| row | layout | ISL/OSL | load | throughput pub / pred | err | ITL pub / TPOT pred ms | err "
             "| TTFT pub / pred ms | err | within |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in results:
        r, pub = o["row"], o["published"]
        name = f"{SHORT[r['model']]} {r['gpu']}"
        load = f"c={r['concurrency']}" if "concurrency" in r else f"offline {o.get('traffic', {}).get('offline_requests', '')}"
        if "predicted" not in o:
            lines.append(f"| {name} | TP{r['tp']} | {r['isl']}/{r['osl']} | {load} | {num(pub['throughput_tok_s'])} / - "
                         f"| | | | | | not predicted: {o['skipped']} |")
            continue
        g, e, m = o["predicted"], o["error"], o["meets"]
        ok = "all" if all(m.values()) else "no: " + ", ".join(k for k, v in m.items() if not v)
        lines.append(
            f"| {name} | {g['layout']} | {r['isl']}/{r['osl']} | {load} "
            f"| {num(pub['throughput_tok_s'])} / {num(g['throughput_tok_s'])} | {pct(e['throughput'])} "
            f"| {num(pub.get('itl_ms'), 2) + ' / ' + num(g['tpot_ms'], 2) if 'itl_ms' in pub else ''} | {pct(e.get('tpot'))} "
            f"| {num(pub.get('ttft_ms'), 0) + ' / ' + num(g['ttft_ms'], 0) if 'ttft_ms' in pub else ''} | {pct(e.get('ttft'))} "
            f"| {ok} |")
    return "\n".join(lines)


def summary(results: list[dict]) -> dict:
    """Per table: rows, rows predicted, rows within each target, median absolute errors."""
    out = {}
    for tid in dict.fromkeys(o["table"] for o in results):
        mine = [o for o in results if o["table"] == tid]
        got = [o for o in mine if "predicted" in o]
        d = {"rows": len(mine), "predicted": len(got), "skipped": len(mine) - len(got)}
        for k in ("throughput", "tpot", "ttft"):
            errs = [abs(o["error"][k]) for o in got if k in o["error"]]
            if errs:
                d[k] = {"n": len(errs), "within": sum(o["meets"][k] for o in got if k in o["meets"]),
                        "median_abs_error": statistics.median(errs), "max_abs_error": max(errs)}
        d["all_targets"] = sum(all(o["meets"].values()) for o in got)
        out[tid] = d
    return out


def summary_text(s: dict) -> str:
    lines = []
    for tid, d in s.items():
        parts = [f"{tid}: {d['predicted']} of {d['rows']} rows predicted"]
        for k, t in (("throughput", THROUGHPUT_TARGET), ("tpot", TPOT_TARGET), ("ttft", TTFT_TARGET)):
            if k in d:
                parts.append(f"{k} within {t:.0%}: {d[k]['within']}/{d[k]['n']} (median |err| "
                             f"{d[k]['median_abs_error']:.1%}, worst {d[k]['max_abs_error']:.0%})")
        parts.append(f"every target: {d['all_targets']}/{d['predicted']}")
        lines.append("; ".join(parts))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated row ids (or prefixes: a table id) to run")
    ap.add_argument("--out", type=Path, default=OUT, help=f"results JSON (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--diagnose", choices=("kv", "start", "both"),
                    help="a what-if on the NIM rows, not a verdict: kv = an FP8 KV cache instead of the rules' BF16, "
                         "start = staggered users instead of together, both (writes published_diagnose_<what>.json "
                         "unless --out)")
    a = ap.parse_args(argv)
    variant = {}
    if a.diagnose in ("kv", "both"):
        variant["nim_kv"] = "fp8"
    if a.diagnose in ("start", "both"):
        variant["nim_start"] = "staggered"
    if a.diagnose and a.out == OUT:
        a.out = OUT.with_name(f"published_diagnose_{a.diagnose}.json")
    if model_configs() is None:
        print("aiconfigurator-core is not installed: nothing measured", file=sys.stderr)
        return 0
    wanted = [w for w in (a.only or "").split(",") if w]
    t0 = time.perf_counter()
    results = []
    for table in load_tables():
        for r in table["rows"]:
            rid = row_id(table, r)
            if wanted and not any(rid == w or rid.startswith(w) for w in wanted):
                continue
            o = run_row(table, r, **variant)
            results.append(o)
            print(f"{rid}: " + (f"skipped ({o['skipped']})" if "predicted" not in o else
                                ", ".join(f"{k} {pct(v)}" for k, v in o["error"].items())), file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0
    s = summary(results)
    print(markdown(results))
    print()
    print(summary_text(s))
    print(f"({wall:.0f} s)")
    from importlib.metadata import version

    meta = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
            "python": platform.python_version(), "aiconfigurator_core": version("aiconfigurator-core"),
            "wall_s": wall, "data": str(DATA.relative_to(ROOT)), "variant": variant or "the rules (module docstring)",
            "sources": {t["id"]: t["source"] for t in load_tables()},
            "targets": {"throughput": THROUGHPUT_TARGET, "tpot": TPOT_TARGET, "ttft": TTFT_TARGET}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"meta": meta, "summary": s, "rows": results}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
