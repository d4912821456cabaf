"""The product against NVIDIA's aiconfigurator on the same questions (issue #24 acceptance).

``python -m benchmarks.bench_vs_aiconfigurator [--aic PATH] [--only NAME,...]``

aiconfigurator is **not** a dependency of the product: it is run as a subprocess from its own
virtual environment. Install it once, apart from the project's venv::

    python3 -m venv /tmp/aicvenv
    /tmp/aicvenv/bin/pip install aiconfigurator==0.12.0

and pass its CLI with ``--aic /tmp/aicvenv/bin/aiconfigurator`` (the default; also
``$AICONFIGURATOR``). Without it the benchmark prints why and exits 0 having measured nothing.
Both sides use the same measured kernel database (aiconfigurator-core 0.12.0, which the product
depends on; the benchmark checks that aiconfigurator's venv has the same version), the same
engine (TensorRT-LLM) and the database version aiconfigurator searched with.

For each question (:data:`QUESTIONS`):

1. ``aiconfigurator cli default`` (its search; wall time of the command): its best aggregated
   and disaggregated configurations (rank 1 of ``best_config_topn.csv``) with tokens/s/GPU and
   tokens/s/user.
2. The product's serving optimiser on the same question and GPUs: ``performance.source:
   measured, engine: trtllm``, the same database version and GEMM lane, ``objective: goodput``
   (the highest request rate meeting the SLO with these GPUs) at a ``rate_rps`` far above any
   plan's capacity, ``mode: both``, ``homogeneous: true`` (one configuration per role, as
   aiconfigurator's answers are and its estimate takes), the KV-cache dtype aiconfigurator timed, once per chunk budget in :data:`CHUNKS` (the product does not
   search the chunk size itself); its best plan is the one with the highest simulated tokens/s/GPU.
   Search time: the wall time of the ``optimize`` commands, with the time spent building step
   tables (first use of a layout; cached on disk afterwards) stated apart.
3. That plan evaluated by ``aiconfigurator cli estimate``: same layouts and worker counts, the
   product's chunk budget as ``--ctx-tokens``, and as batch the load the product's simulation puts
   on each worker, per attention-DP rank as aiconfigurator counts its batch (aggregated: in
   flight per worker by Little's law, ``load_rps x mean E2E``; decode: the simulated time-average
   decodes per worker; prefill: 1). Target: at least aiconfigurator's best tokens/s/GPU.
4. ``optimize estimate`` of aiconfigurator's chosen configurations (its workers, TP, per-worker
   batch as ``max_batch``, the ``max_num_tokens`` of the engine configuration it generates for
   the aggregated answer as chunk budget, its total concurrency as a closed loop): the product's tokens/s/GPU against aiconfigurator's own figure. Target: within 5%.
   For disaggregated rows the figure aiconfigurator had before its fixed rate-matching derates
   (prefill x 0.9, decode x 0.92, ``aiconfigurator/sdk/picking.py``) is printed beside it, as a
   diagnostic only.

Writes ``benchmarks/results/vs_aiconfigurator.json``. Nothing is tuned on the answers.
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "instances" / "models"
DEFAULT_AIC = os.environ.get("AICONFIGURATOR", "/tmp/aicvenv/bin/aiconfigurator")
RATE = 1000.0  # req/s: above any plan's capacity, so goodput is limited by the GPUs and the SLO only
CHUNKS = (2048, 8192)  # the product's default chunk budget and TensorRT-LLM's max_num_tokens default
OUT = ROOT / "benchmarks" / "results" / "vs_aiconfigurator.json"

# Catalog GPU / server of each aiconfigurator system name
GPUS = {"h200_sxm": ("h200-sxm", "hgx-h200"), "h100_sxm": ("h100-sxm", "hgx-h100")}

QUESTIONS = [
    {"name": "readme", "title": "Qwen3-32B-FP8, 32 H200, ISL 4000 / OSL 500, TTFT 300 ms, TPOT 10 ms",
     "model": "Qwen/Qwen3-32B-FP8", "config": "qwen3-32b.json", "system": "h200_sxm", "gpus": 32,
     "isl": 4000, "osl": 500, "ttft": 300, "tpot": 10},
    {"name": "moe", "title": "Qwen3-235B-A22B-FP8 (MoE), 16 H200, ISL 4000 / OSL 500, TTFT 1000 ms, TPOT 20 ms",
     "model": "Qwen/Qwen3-235B-A22B-FP8", "config": "qwen3-235b-a22b.json", "system": "h200_sxm", "gpus": 16,
     "isl": 4000, "osl": 500, "ttft": 1000, "tpot": 20},
    {"name": "long", "title": "Qwen3-32B-FP8, 32 H200, ISL 16000 / OSL 500, TTFT 1000 ms, TPOT 15 ms",
     "model": "Qwen/Qwen3-32B-FP8", "config": "qwen3-32b.json", "system": "h200_sxm", "gpus": 32,
     "isl": 16000, "osl": 500, "ttft": 1000, "tpot": 15},
    # aiconfigurator's mixed-GPU search is disaggregated only (--decode-system), over a total GPU
    # count; the product gets the GPUs aiconfigurator's answer uses, per type, as two pools
    {"name": "mixed", "title": "Qwen3-32B-FP8, prefill H100 / decode H200, 32 GPUs, ISL 4000 / OSL 500, TTFT 300 ms, TPOT 10 ms",
     "model": "Qwen/Qwen3-32B-FP8", "config": "qwen3-32b.json", "system": "h100_sxm", "decode_system": "h200_sxm",
     "gpus": 32, "isl": 4000, "osl": 500, "ttft": 300, "tpot": 10, "modes": "disagg"},
]


# ----------------------------------------------------------------------------- aiconfigurator
def _run(cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return r, time.perf_counter() - t0


def aic_search(aic: str, q: dict, save: Path) -> dict:
    """aiconfigurator's own search: rank-1 aggregated and disaggregated rows and its wall time."""
    cmd = [aic, "cli", "default", "--model-path", q["model"], "--total-gpus", str(q["gpus"]), "--system", q["system"],
           "--isl", str(q["isl"]), "--osl", str(q["osl"]), "--ttft", str(q["ttft"]), "--tpot", str(q["tpot"]),
           "--backend", "trtllm"]
    if q.get("decode_system"):
        cmd += ["--decode-system", q["decode_system"]]
    if q.get("modes"):
        cmd += ["--serving-mode", q["modes"]]
    out = {"command": " ".join(["aiconfigurator"] + cmd[1:])}
    r, dt = _run(cmd + ["--save-dir", str(save), "--no-color"])
    out["wall_s"] = dt
    m = re.search(r"All experiments completed in ([0-9.]+) seconds", r.stdout + r.stderr)
    out["search_s"] = float(m.group(1)) if m else None
    for mode in ("agg", "disagg"):
        files = sorted(save.glob(f"**/{mode}/best_config_topn.csv"))
        if files:
            with files[0].open() as fh:
                rows = list(csv.DictReader(fh))
            out[mode] = rows[0] if rows else None
    if "agg" not in out and "disagg" not in out:
        raise RuntimeError(f"aiconfigurator found nothing (exit {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    # the engine configuration aiconfigurator generates for its rank-1 aggregated answer
    # (TensorRT-LLM max_num_tokens: its context budget plus headroom for the decodes)
    gen = sorted(save.glob("**/agg/top1/agg_config.yaml"))
    if gen:
        out["agg_engine_config"] = {k: v for k, v in (yaml.safe_load(gen[0].read_text()) or {}).items()
                                    if k in ("max_batch_size", "max_num_tokens", "enable_chunked_prefill")}
    row = out.get("agg") or out.get("disagg")
    # the KV-cache dtype its search timed (column kvcache: fp8 for the -FP8 checkpoints, as the
    # engine configurations it generates say), given to the product as model.kv_dtype so both
    # time the same KV reads and hold the same KV capacity
    kv = row.get("kvcache") or row.get("(d)kvcache")
    out["kv_dtype"] = {"fp8": "fp8", "bfloat16": "bf16", "float16": "fp16"}.get(str(kv))
    out["db_version"] = row.get("version") or row.get("(p)version")
    out["gemm"] = row.get("gemm") or row.get("(p)gemm")
    return out


def aic_estimate(aic: str, q: dict, args: list[str]) -> dict:
    """``aiconfigurator cli estimate`` of one configuration: its printed figures."""
    cmd = [aic, "cli", "estimate", "--model-path", q["model"], "--backend", "trtllm", "--isl", str(q["isl"]),
           "--osl", str(q["osl"]), "--no-color"] + args
    if q.get("db_version"):  # the database version its search used
        cmd += ["--perf-db-version", q["db_version"]]
    r, dt = _run(cmd)
    text = r.stdout + r.stderr
    fig = {}
    for key, pat in (("ttft_ms", r"TTFT:\s+([0-9.,]+) ms"), ("tpot_ms", r"TPOT:\s+([0-9.,]+) ms"),
                     ("tokens_per_s", r"tokens/s:\s+([0-9.,]+)"), ("tokens_per_s_per_gpu", r"tokens/s/gpu:\s+([0-9.,]+)"),
                     ("tokens_per_s_per_user", r"tokens/s/user:\s+([0-9.,]+)"), ("seq_per_s", r"seq/s:\s+([0-9.,]+)")):
        m = re.search(pat, text)
        if m:
            fig[key] = float(m.group(1).replace(",", ""))
    if "tokens_per_s_per_gpu" not in fig:
        return {"error": (text.strip().splitlines() or ["no output"])[-1][-300:], "args": args, "wall_s": dt}
    fig["args"], fig["wall_s"] = args, dt
    return fig


def _par(tp: int, dp: int, etp: int, ep: int, moe: bool, prefix: str = "") -> list[str]:
    a = [f"--{prefix}tp-size", str(tp), f"--{prefix}attention-dp-size", str(dp)]
    if moe:
        a += [f"--{prefix}moe-tp-size", str(etp), f"--{prefix}moe-ep-size", str(ep)]
    return a


# ----------------------------------------------------------------------------- product
def pools_of(q: dict, aic: dict) -> list[dict]:
    """The product's GPUs: one pool, or (mixed) the GPUs per type that aiconfigurator's answer uses."""
    if not q.get("decode_system"):
        gpu, server = GPUS[q["system"]]
        return [{"gpu": gpu, "server": server, "count": q["gpus"]}]
    d = aic["disagg"]
    reps = q["gpus"] // int(d["num_total_gpus"])
    gp = reps * int(d["(p)workers"]) * int(d["(p)tp"]) * int(d["(p)dp"])
    gd = reps * int(d["(d)workers"]) * int(d["(d)tp"]) * int(d["(d)dp"])
    return [dict(zip(("gpu", "server"), GPUS[q["system"]]), count=gp),
            dict(zip(("gpu", "server"), GPUS[q["decode_system"]]), count=gd)]


def instance(q: dict, aic: dict, serving: dict) -> dict:
    pools = pools_of(q, aic)
    hw = ({"gpu": pools[0]["gpu"], "server": pools[0]["server"], "servers": math.ceil(pools[0]["count"] / 8)}
          if len(pools) == 1 and pools[0]["count"] % 8 == 0 else {"pools": pools})
    raw = {"name": q["name"], "model": {"config": str(MODELS / q["config"]), "hf_id": q["model"], "weight_dtype": "fp8"},
           "hardware": hw,
           "serving": dict({"slo": {"ttft_ms": q["ttft"], "tpot_ms": q["tpot"]}}, **serving),
           "performance": {"source": "measured", "engine": "trtllm", "engine_version": aic["db_version"]}}
    if aic["gemm"] and aic["gemm"] != "fp8":
        raw["performance"]["gemm_quant"] = aic["gemm"]
    if aic.get("kv_dtype"):
        raw["model"]["kv_dtype"] = aic["kv_dtype"]
    return raw


def product(raw: dict, args: list[str], tmp: Path, env: dict) -> tuple[dict, float, float, str]:
    """Run ``optimize [estimate] INSTANCE --format json``: (JSON, wall s, table-building s, stderr)."""
    f = tmp / f"{raw['name']}-{abs(hash(json.dumps(raw, sort_keys=True)))}.yaml"
    f.write_text(yaml.safe_dump(raw, sort_keys=False))
    r, dt = _run([sys.executable, "-m", "optimizer.cli", *args[:1], str(f), "--format", "json", *args[1:]], cwd=ROOT,
                 env=env)
    if r.returncode not in (0,):
        raise RuntimeError(f"optimize {' '.join(args)} exit {r.returncode}: {r.stderr[-2000:]}")
    built = sum(float(x) for x in re.findall(r"started in ([0-9.]+) s", r.stderr))
    return json.loads(r.stdout), dt, built, r.stderr


def product_search(q: dict, aic: dict, tmp: Path, env: dict) -> dict:
    """The product's best plan (highest simulated tokens/s/GPU) over :data:`CHUNKS`, both modes."""
    runs, best, by_mode = [], None, {}
    for chunk in CHUNKS:
        # one configuration per role (serving.homogeneous), as aiconfigurator's answers are and as
        # its estimate can evaluate
        raw = instance(q, aic, {"traffic": {"rate_rps": RATE, "isl": q["isl"], "osl": q["osl"]}, "mode": "both",
                                "objective": "goodput", "chunk_tokens": chunk, "homogeneous": True})
        d, wall, built, _ = product(raw, [], tmp, env)
        runs.append({"chunk_tokens": chunk, "wall_s": wall, "tables_s": built, "solver_s": d["solver"]["time_s"]})
        for rate in d["plan"]["rates"]:
            for mode, m in rate["modes"].items():
                if m.get("status") != "ok":
                    continue
                cand = {"chunk_tokens": chunk, "mode": mode, "plan": m}
                tps = m["simulated"]["tokens_per_s_per_gpu"]
                m["_tps"] = tps
                if best is None or tps > best["plan"]["_tps"]:
                    best = cand
                if mode not in by_mode or tps > by_mode[mode]["plan"]["_tps"]:
                    by_mode[mode] = cand
                runs[-1].setdefault("modes", {})[mode] = {"rate_rps": m["rate_rps"], "tokens_per_s_per_gpu": tps,
                                                          "workers": _workers_text(m)}
    return {"runs": runs, "best": best, "by_mode": by_mode, "raw": raw}


def _workers_text(m: dict) -> str:
    return " + ".join(f"{w['count']}x {w['role'][0].upper()} {w['layout']} {w['gpu']}" for w in m["workers"])


def product_plan_in_aic(aic_cli: str, q: dict, best: dict) -> dict:
    """aiconfigurator's estimate of the product's plan (see the module docstring, step 3)."""
    m, chunk = best["plan"], best["chunk_tokens"]
    moe = "moe" in q["name"] or "A22B" in q["model"] or "A3B" in q["model"]
    systems = {v[0]: k for k, v in GPUS.items()}
    sim = m["simulated"]
    if best["mode"] == "aggregated":
        parts, tokens, gpus = [], 0.0, 0
        for w in m["workers"]:
            lay = w["layout_detail"]
            # aiconfigurator's batch is per attention-DP rank
            bs = max(1, round(w["load_rps"] * sim["e2e_ms"]["mean"] / 1e3 / lay["attention"]["dp"]))
            e = aic_estimate(aic_cli, q, ["--estimate-mode", "agg", "--system", systems[w["gpu"]], "--batch-size", str(bs),
                                          "--ctx-tokens", str(chunk)] +
                             _par(lay["attention"]["tp"], lay["attention"]["dp"], lay["experts"]["tp"],
                                  lay["experts"]["ep"], moe))
            e["workers"], e["batch"] = w["count"], bs
            parts.append(e)
            if "error" in e:
                return {"parts": parts, "error": e["error"]}
            tokens += e["tokens_per_s_per_gpu"] * w["gpus"]
            gpus += w["gpus"]
        ok = all(p["ttft_ms"] <= q["ttft"] and p["tpot_ms"] <= q["tpot"] for p in parts)
        return {"parts": parts, "tokens_per_s_per_gpu": tokens / gpus, "meets_slo": ok,
                "tokens_per_s_per_user": min(p["tokens_per_s_per_user"] for p in parts)}
    # one prefill and one decode worker type per aiconfigurator estimate: a plan over two pools
    # that has both roles in each is estimated as one sub-plan per pool, tokens/s added
    groups = {}
    for w in m["workers"]:
        groups.setdefault(w["pool"], []).append(w)
    if len(groups) > 1 and not all(sorted(x["role"] for x in g) == ["decode", "prefill"] for g in groups.values()):
        groups = {None: m["workers"]}
    parts, tokens, gpus = [], 0.0, 0
    for g in groups.values():
        pre = [w for w in g if w["role"] == "prefill"]
        dec = [w for w in g if w["role"] == "decode"]
        if len(pre) != 1 or len(dec) != 1:
            return {"error": "aiconfigurator's estimate takes one prefill and one decode worker type; the plan has "
                             f"{len(pre)} and {len(dec)}"}
        p, d = pre[0], dec[0]
        lp, ld = p["layout_detail"], d["layout_detail"]
        mean = sim["mean_batch"][f"decode {d['layout']} on {d['pool']}"]
        bs = max(1, round(mean / ld["attention"]["dp"]))  # per attention-DP rank
        e = aic_estimate(aic_cli, q, ["--estimate-mode", "disagg", "--system", systems[p["gpu"]],
                                      "--decode-system", systems[d["gpu"]],
                                      "--prefill-batch-size", "1", "--prefill-num-workers", str(p["count"]),
                                      "--decode-batch-size", str(bs), "--decode-num-workers", str(d["count"])] +
                         _par(lp["attention"]["tp"], lp["attention"]["dp"], lp["experts"]["tp"], lp["experts"]["ep"],
                              moe, "prefill-") +
                         _par(ld["attention"]["tp"], ld["attention"]["dp"], ld["experts"]["tp"], ld["experts"]["ep"],
                              moe, "decode-"))
        e["decode_batch"] = bs
        parts.append(e)
        if "error" in e:
            return {"parts": parts, "error": e["error"]}
        g_gpus = p["gpus"] + d["gpus"]
        tokens += e["tokens_per_s_per_gpu"] * g_gpus
        gpus += g_gpus
    ok = all(x["ttft_ms"] <= q["ttft"] and x["tpot_ms"] <= q["tpot"] for x in parts)
    return {"parts": parts, "tokens_per_s_per_gpu": tokens / gpus, "meets_slo": ok,
            "tokens_per_s_per_user": min(x["tokens_per_s_per_user"] for x in parts)}


def _parse_par(s: str) -> dict:
    return {k: int(v) for k, v in re.findall(r"(tp|pp|dp|etp|ep)(\d+)", s)}


def aic_config_in_product(q: dict, aic: dict, mode: str, tmp: Path, env: dict) -> dict:
    """``optimize estimate`` of aiconfigurator's rank-1 configuration of ``mode`` (step 4)."""
    row = aic[mode]
    moe = "A22B" in q["model"] or "A3B" in q["model"]
    pools = pools_of(q, aic)
    reps = q["gpus"] // int(row["num_total_gpus"])

    def worker(role, par, count, bs, pool):
        w = {"role": role, "count": count, "tp": par["tp"], "dp": par.get("dp", 1), "pool": pool}
        if moe:
            w["ep"] = par.get("ep", 1)
        if bs is not None:  # aiconfigurator's bs is per attention-DP rank
            w["max_batch"] = bs * par.get("dp", 1)
        return w

    if mode == "agg":
        par = _parse_par(row["parallel"])
        workers = [worker("aggregated", par, reps, int(row["bs"]), pools[0]["gpu"])]
        # the step budget of the engine aiconfigurator deploys (max_num_tokens, which TensorRT-LLM
        # counts with the decodes' tokens, as the product's trtllm scheduler does); without its
        # generated config, its context budget plus the batch
        chunk = int((aic.get("agg_engine_config") or {}).get("max_num_tokens")
                    or int(float(row["ctx_tokens"])) + int(row["bs"]))
        conc = int(row["concurrency"]) * reps
    else:
        pp, dp_ = _parse_par(row["(p)parallel"]), _parse_par(row["(d)parallel"])
        workers = [worker("prefill", pp, reps * int(row["(p)workers"]), None, pools[0]["gpu"]),
                   worker("decode", dp_, reps * int(row["(d)workers"]), int(row["(d)bs"]), pools[-1]["gpu"])]
        chunk = 8192
        conc = int(row["concurrency"]) * reps
    raw = instance(q, aic, {"traffic": {"concurrency": conc, "isl": q["isl"], "osl": q["osl"]}, "chunk_tokens": chunk,
                            "fixed": {"workers": workers}})
    raw["name"] = f"{q['name']}-aic-{mode}"
    try:
        d, wall, built, _ = product(raw, ["estimate"], tmp, env)
    except RuntimeError as exc:
        return {"error": str(exc).splitlines()[-1][-300:], "concurrency": conc}
    f = d["plan"]["estimates"][0]["figures"]
    # diagnostic: the same workers under open-loop Poisson arrivals at the rate the closed loop
    # reached (the traffic the product's optimiser sizes for)
    raw["serving"]["traffic"] = {"rate_rps": round(f["request_rate_rps"], 3), "isl": q["isl"], "osl": q["osl"]}
    raw["name"] = f"{q['name']}-aic-{mode}-open"
    o = product(raw, ["estimate"], tmp, env)[0]["plan"]["estimates"][0]["figures"]
    return {"concurrency": conc, "chunk_tokens": chunk, "workers": workers, "wall_s": wall,
            "open_loop": {"rate_rps": round(f["request_rate_rps"], 3), "attainment": o["attainment"],
                          "ttft_p90_ms": o["ttft_ms"]["p90"], "tpot_p90_ms": o["tpot_ms"]["p90"]},
            "tokens_per_s_per_gpu": f["tokens_per_s_per_gpu"], "tokens_per_s_per_user": f["tokens_per_s_per_user"],
            "ttft_ms": f["ttft_ms"]["mean"], "tpot_ms": f["tpot_ms"]["mean"], "ttft_p90_ms": f["ttft_ms"]["p90"],
            "tpot_p90_ms": f["tpot_ms"]["p90"], "attainment": f["attainment"],
            "aic_tokens_per_s_per_gpu": float(row["tokens/s/gpu"]), "aic_tokens_per_s_per_user": float(row["tokens/s/user"]),
            "aic_ttft_ms": float(row["ttft"]), "aic_tpot_ms": float(row["tpot"]),
            "error_tokens_per_s_per_gpu": f["tokens_per_s_per_gpu"] / float(row["tokens/s/gpu"]) - 1,
            "aic_before_derates_tokens_per_s_per_gpu": (
                min(float(row["(p)seq/s/worker"]) * int(row["(p)workers"]),
                    float(row["(d)seq/s/worker"]) * int(row["(d)workers"])) * q["osl"] / int(row["num_total_gpus"])
                if mode == "disagg" else None)}


# ----------------------------------------------------------------------------- report
def _lay(s: str) -> str:
    """aiconfigurator's ``tp1pp1dp2etp1ep2`` in the product's layout label style (``TP1xDP2/EP2``)."""
    d = _parse_par(s)
    return f"TP{d['tp']}" + (f"xDP{d['dp']}" if d.get("dp", 1) > 1 else "") + (f"/EP{d['ep']}" if d.get("ep", 1) > 1 else "")


def _aic_text(row: dict, mode: str, q: dict) -> str:
    reps = q["gpus"] // int(row["num_total_gpus"])
    if mode == "agg":
        return f"{reps}x {_lay(row['parallel'])} bs {row['bs']} (conc. {int(row['concurrency']) * reps})"
    return (f"{reps * int(row['(p)workers'])}x P {_lay(row['(p)parallel'])} + "
            f"{reps * int(row['(d)workers'])}x D {_lay(row['(d)parallel'])} bs {row['(d)bs']} "
            f"(conc. {int(row['concurrency']) * reps})")


def met(r: dict) -> bool:
    """Target 3: aiconfigurator's estimate of the product's best plan meets the SLO with at least
    aiconfigurator's best tokens/s/GPU."""
    e = r["product_in_aic"].get(r["product"]["best"]["mode"], {})
    return "error" not in e and e["meets_slo"] and e["tokens_per_s_per_gpu"] >= r["aic_best"]


def report(results: list[dict]) -> str:
    lines = []
    for r in results:
        q, a, p = r["question"], r["aic"], r["product"]
        lines.append(f"\n== {q['title']}  (trtllm {a['db_version']}, GEMM {a['gemm']})")
        for mode in ("agg", "disagg"):
            if a.get(mode):
                row = a[mode]
                lines.append(f"  aiconfigurator {mode:6s}: {_aic_text(row, mode, q):44s} {float(row['tokens/s/gpu']):7.1f} "
                             f"tok/s/GPU {float(row['tokens/s/user']):6.1f} tok/s/user  TTFT {float(row['ttft']):.0f} ms "
                             f"TPOT {float(row['tpot']):.2f} ms")
        lines.append(f"  aiconfigurator search: {a['wall_s']:.1f} s wall ({a['search_s']} s reported)")
        for run in p["runs"]:
            for mode, m in run.get("modes", {}).items():
                lines.append(f"  product chunk {run['chunk_tokens']:5d} {mode:13s}: {m['workers']:44s} {m['tokens_per_s_per_gpu']:7.1f} "
                             f"tok/s/GPU at {m['rate_rps']:.2f} req/s")
            lines.append(f"  product search chunk {run['chunk_tokens']}: {run['wall_s']:.1f} s wall "
                         f"({run['tables_s']:.1f} s building step tables)")
        b = p["best"]
        s = b["plan"]["simulated"]
        lines.append(f"  product best: {b['mode']} chunk {b['chunk_tokens']}: {s['tokens_per_s_per_gpu']:.1f} tok/s/GPU "
                     f"{s['tokens_per_s_per_user']:.1f} tok/s/user, p90 TTFT {s['ttft_ms']['p90']:.0f} ms, "
                     f"p90 TPOT {s['tpot_ms']['p90']:.2f} ms (simulated)")
        for mode, e in r["product_in_aic"].items():
            tag = "best plan" if mode == b["mode"] else f"{mode} plan"
            if "error" in e:
                lines.append(f"  aiconfigurator estimate of the product's {tag}: not run ({e['error']})")
                continue
            lines.append(f"  aiconfigurator estimate of the product's {tag}: {e['tokens_per_s_per_gpu']:.1f} tok/s/GPU "
                         f"{e['tokens_per_s_per_user']:.1f} tok/s/user (SLO met by its estimate: {e['meets_slo']}) vs its "
                         f"best {r['aic_best']:.1f}" + (f": {'MET' if met(r) else 'missed'}" if mode == b["mode"] else ""))
        for mode, c in r["aic_in_product"].items():
            if "error" in c:
                lines.append(f"  product estimate of aiconfigurator's {mode}: not run ({c['error']})")
                continue
            lines.append(f"  product estimate of aiconfigurator's {mode}: {c['tokens_per_s_per_gpu']:.1f} tok/s/GPU "
                         f"{c['tokens_per_s_per_user']:.1f} tok/s/user (TTFT {c['ttft_ms']:.0f} TPOT {c['tpot_ms']:.2f} ms) vs "
                         f"aiconfigurator {c['aic_tokens_per_s_per_gpu']:.1f} / {c['aic_tokens_per_s_per_user']:.1f}: "
                         f"{c['error_tokens_per_s_per_gpu']:+.1%} ({'MET' if abs(c['error_tokens_per_s_per_gpu']) <= 0.05 else 'missed'})"
                         + (f"; before its derates {c['aic_before_derates_tokens_per_s_per_gpu']:.1f}"
                            if c.get("aic_before_derates_tokens_per_s_per_gpu") else ""))
    return "\n".join(lines)


def markdown(results: list[dict]) -> str:
    """The tables of docs/benchmarks.md ("Against aiconfigurator")."""
    out = ["| question | aiconfigurator aggregated | aiconfigurator disaggregated | aiconfigurator search s | "
           "product best plan (simulated) | product search s, cold / warm |", "|---|---|---|---|---|---|"]
    for r in results:
        q, a, p = r["question"], r["aic"], r["product"]
        cells = []
        for mode in ("agg", "disagg"):
            row = a.get(mode)
            cells.append(f"{_aic_text(row, mode, q)}: **{float(row['tokens/s/gpu']):.1f}** tok/s/GPU, "
                         f"{float(row['tokens/s/user']):.1f} tok/s/user" if row else "none (not searched)")
        b = p["best"]
        s = b["plan"]["simulated"]
        runs = p["runs"]
        cold = runs[0]
        out.append(f"| {q['title']} | {cells[0]} | {cells[1]} | {a['wall_s']:.1f} | {b['mode']} "
                   f"{_workers_text(b['plan'])}, chunk {b['chunk_tokens']}: **{s['tokens_per_s_per_gpu']:.1f}** tok/s/GPU, "
                   f"{s['tokens_per_s_per_user']:.1f} tok/s/user | {sum(x['wall_s'] for x in runs):.1f} for {len(runs)} runs "
                   f"(first {cold['wall_s']:.1f}, of it {cold['tables_s']:.1f} building tables) / "
                   f"{runs[-1]['wall_s']:.1f} |")
    out += ["", "| question | aiconfigurator's estimate of the product's best plan | vs aiconfigurator's best | "
            "target 3 (>= best, SLO met) | product's estimate of aiconfigurator's aggregated | of its disaggregated | "
            "target 4 (within 5%) |", "|---|---|---|---|---|---|---|"]
    for r in results:
        q, b = r["question"], r["product"]["best"]
        e = r["product_in_aic"].get(b["mode"], {})
        if "error" in e:
            est = f"not run: {e['error']}"
        else:
            est = (f"{e['tokens_per_s_per_gpu']:.1f} tok/s/GPU, {e['tokens_per_s_per_user']:.1f} tok/s/user"
                   + ("" if e["meets_slo"] else " (its estimate misses the SLO: " + ", ".join(
                       f"TTFT {x['ttft_ms']:.0f} ms TPOT {x['tpot_ms']:.2f} ms" for x in e.get("parts", [e])) + ")"))
        cells, ok = [], []
        for mode in ("agg", "disagg"):
            c = r["aic_in_product"].get(mode)
            if c is None:
                cells.append("none")
            elif "error" in c:
                cells.append(f"not run: {c['error']}")
            else:
                ok.append(abs(c["error_tokens_per_s_per_gpu"]) <= 0.05)
                cells.append(f"{c['tokens_per_s_per_gpu']:.1f} vs {c['aic_tokens_per_s_per_gpu']:.1f} "
                             f"(**{c['error_tokens_per_s_per_gpu']:+.1%}**); TTFT {c['ttft_ms']:.0f} vs {c['aic_ttft_ms']:.0f} ms, "
                             f"TPOT {c['tpot_ms']:.2f} vs {c['aic_tpot_ms']:.2f} ms (means; simulated p90 "
                             f"{c['ttft_p90_ms']:.0f} / {c['tpot_p90_ms']:.2f} ms, attainment {c['attainment']:.0%}; "
                             f"Poisson at {c['open_loop']['rate_rps']:.3g} req/s: p90 {c['open_loop']['ttft_p90_ms']:.0f} / "
                             f"{c['open_loop']['tpot_p90_ms']:.2f} ms, attainment {c['open_loop']['attainment']:.0%})"
                             + (f"; {c['aic_before_derates_tokens_per_s_per_gpu']:.1f} before its derates"
                                if c.get("aic_before_derates_tokens_per_s_per_gpu") else ""))
        out.append(f"| {q['name']} | {est} | {r['aic_best']:.1f} | {'met' if met(r) else 'missed'} | {cells[0]} | {cells[1]} | "
                   + ", ".join("met" if x else "missed" for x in ok) + " |")
    return "\n".join(out)


def aic_core_version(aic: str) -> str | None:
    py = Path(aic).with_name("python")
    if not py.exists():
        return None
    r = subprocess.run([str(py), "-c", "from importlib.metadata import version as v; print(v('aiconfigurator'), "
                                       "v('aiconfigurator-core'))"], capture_output=True, text=True)
    return r.stdout.strip() or None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aic", default=DEFAULT_AIC, help="aiconfigurator's CLI in its own venv (default %(default)s)")
    ap.add_argument("--only", default=None, help="comma-separated question names (" +
                    ", ".join(q["name"] for q in QUESTIONS) + ")")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    if not (Path(a.aic).is_file() and os.access(a.aic, os.X_OK)):
        print(f"skipped: aiconfigurator's CLI not found at {a.aic}. Install it apart from the project: "
              f"python3 -m venv /tmp/aicvenv && /tmp/aicvenv/bin/pip install aiconfigurator==0.12.0; "
              f"then pass --aic /tmp/aicvenv/bin/aiconfigurator")
        return 0
    from importlib.metadata import version

    versions = aic_core_version(a.aic)
    ours = version("aiconfigurator-core")
    if versions and versions.split()[-1] != ours:
        print(f"skipped: aiconfigurator's venv has aiconfigurator-core {versions.split()[-1]}, the product {ours}: "
              f"not the same database")
        return 0
    env = dict(os.environ)
    want = set(a.only.split(",")) if a.only else None
    results = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for q in QUESTIONS:
            if want and q["name"] not in want:
                continue
            print(f"-- {q['title']}", file=sys.stderr, flush=True)
            aic = aic_search(a.aic, q, tmp / f"aic-{q['name']}")
            q = dict(q, db_version=aic["db_version"])
            best_aic = max(float(aic[m]["tokens/s/gpu"]) for m in ("agg", "disagg") if aic.get(m))
            prod = product_search(q, aic, tmp, env)
            res = {"question": q, "aic": aic, "aic_best": best_aic, "product": prod,
                   "product_in_aic": {m: product_plan_in_aic(a.aic, q, c) for m, c in prod["by_mode"].items()},
                   "aic_in_product": {m: aic_config_in_product(q, aic, m, tmp, env) for m in ("agg", "disagg")
                                      if aic.get(m)}}
            results.append(res)
            print(report([res]), flush=True)
    for r in results:  # keep the JSON small: the chosen plan's figures, not every field
        for c in [r["product"]["best"], *r["product"]["by_mode"].values()]:
            c["plan"] = {k: c["plan"][k] for k in ("mode", "rate_rps", "gpus", "workers", "analytic", "simulated")
                         if k in c["plan"]}
        r["product"].pop("raw", None)
    doc = {"date": date.today().isoformat(), "machine": f"{os.cpu_count()} cores, {platform.machine()}",
           "aiconfigurator": versions, "aiconfigurator_core_product": ours, "results": results}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
    print("\n" + markdown(results))
    print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
