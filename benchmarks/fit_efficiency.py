"""Fit the analytic source's efficiency factors to aiconfigurator-core's measured kernel database.

``python -m benchmarks.fit_efficiency [--quick]`` times, for every catalog GPU the database covers
and every engine it has kernels of, decode steps (batch 1-128 at 1K and 8K tokens of context) and
whole-prompt prefills (512-8K tokens) of four real models (Llama-3.1-8B/70B, Qwen3-32B,
Qwen3-30B-A3B, BF16) on TP1-TP8 by the measured source, and fits the three shares of peak of
:mod:`optimizer.model.efficiency` (``compute``, ``memory``, ``network``, each in [0.02, 1]) so the
roofline on the achieved peaks matches those steps in the least-squares sense of
``log(analytic / measured)`` (scipy ``least_squares``). Per generation (Hopper, Ampere, Blackwell)
the factors are fitted to all its GPUs' steps together, and the error of carrying them to a GPU
is measured by fitting on the generation's other GPUs and predicting the left-out one's steps.

Writes ``instances/hardware/efficiency.yaml`` (data the analytic source reads) and
``benchmarks/results/efficiency.json``. Nothing here is fitted on serving runs: the yardstick of the
result is ``benchmarks.bench_fidelity``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("llama-3.1-8b", "qwen3-32b", "llama-3.1-70b", "qwen3-30b-a3b")
HF_IDS = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B", "qwen3-32b": "Qwen/Qwen3-32B",
          "llama-3.1-70b": "meta-llama/Llama-3.1-70B", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B"}
TPS = (1, 2, 4, 8)
BATCHES = (1, 8, 32, 128)
CONTEXTS = (1024, 8192)
PROMPTS = (512, 2048, 8192)
ENGINES = ("vllm", "sglang", "trtllm")


def points(gpu: str, server: str, engine: str, quick: bool):
    """(kind, model, layout, measured s, analytic-at-peak timer) for every step the database times."""
    from optimizer.errors import InputError
    from optimizer.model.config import read_hf_config
    from optimizer.model.hardware import hardware_from_catalog
    from optimizer.model.layout import Layout, layout_problem
    from optimizer.model.measured import NotCovered
    from optimizer.model.perf import PerfModel
    from optimizer.model.steptimes import Performance, resolve

    hw = hardware_from_catalog(gpu, server)
    out = []
    version = None
    for name in MODELS[:2] if quick else MODELS:
        cfg = ROOT / "instances" / "models" / f"{name}.json"
        spec = read_hf_config(cfg)
        pm = PerfModel(spec, hw, 2.0, 2.0, 2 * 2**30, weight_dtype="bf16", kv_dtype="bf16")
        try:
            src = resolve(Performance("measured", engine, path=cfg), pm, cfg, gpu, hf_id=HF_IDS[name])
        except (InputError, NotCovered):
            return [], None
        version = getattr(getattr(src, "base", src), "version", None)
        for tp in TPS:
            lay = Layout.tp(tp)
            if tp > hw.server.gpus or layout_problem(spec, lay) is not None:
                continue
            try:
                if pm.max_sessions(lay, 1024, 0) < 1:
                    continue
                for b in BATCHES:
                    for ctx in CONTEXTS:
                        if pm.max_sessions(lay, ctx, 0) < b:
                            continue
                        y = src.mixed_step_s(lay, 0.0, 0.0, float(b), float(ctx))
                        out.append(("decode", name, lay, y, (0.0, float(b), float(ctx))))
                for n in PROMPTS:
                    y = src.prefill_s(lay, n)
                    out.append(("prefill", name, lay, y, n))
            except (InputError, NotCovered, ValueError) as exc:  # a layout the database cannot time
                print(f"  {gpu} {engine} {name} {lay.label()}: skipped ({exc})", file=sys.stderr)
                continue
    return [(k, n, lay, y, arg, _model(n, hw)) for k, n, lay, y, arg in out if y and y > 0], version


_MODELS: dict = {}


def _model(name, hw):
    from optimizer.model.config import read_hf_config
    from optimizer.model.perf import PerfModel

    key = (name, id(hw))
    if key not in _MODELS:
        spec = read_hf_config(ROOT / "instances" / "models" / f"{name}.json")
        _MODELS[key] = (PerfModel(spec, hw, 2.0, 2.0, 2 * 2**30, weight_dtype="bf16", kv_dtype="bf16"), hw)
    return _MODELS[key]


def predict(pts, x) -> np.ndarray:
    """Analytic step times (s) of ``pts`` on the hardware derated by ``exp(x)``."""
    from optimizer.model.efficiency import derated
    from optimizer.model.prefill import mixed_step_s, prefill_s

    c, m, n = np.exp(x)
    cache = {}
    out = []
    for kind, _name, lay, _y, arg, (pm, hw) in pts:
        key = id(pm)
        if key not in cache:
            cache[key] = pm.with_hardware(derated(hw, c, m, n))
        d = cache[key]
        if kind == "decode":
            out.append(mixed_step_s(d, lay, 0.0, 0.0, arg[1], arg[2]))
        else:
            out.append(prefill_s(d, lay, arg))
    return np.array(out)


def fit(pts) -> tuple[np.ndarray, float]:
    """log factors and the median |error| (%) of the fitted analytic steps against ``pts``."""
    y = np.array([p[3] for p in pts])
    lo, hi = np.log([0.02] * 3), np.zeros(3)
    res = least_squares(lambda x: np.log(predict(pts, x) / y), np.log([0.6, 0.7, 0.7]), bounds=(lo, hi),
                        diff_step=1e-3)
    return res.x, err(pts, res.x)


def err(pts, x) -> float:
    y = np.array([p[3] for p in pts])
    return float(np.median(np.abs(predict(pts, x) / y - 1.0)) * 100.0)


def table(doc: dict) -> str:
    """The docs' table of an ``efficiency.yaml`` document: per (GPU, engine) the fitted shares and the
    median step error with them and at the peaks; per generation the carry-over error."""
    lines = ["| GPU | engine (version) | compute | memory | network | steps | median step error | at the peaks |",
             "|---|---|---|---|---|---|---|---|"]
    for gpu, fits in doc["fits"].items():
        for engine, e in fits.items():
            lines.append(f"| {gpu} | {engine} ({e['version']}) | {e['compute']:.3f} | {e['memory']:.3f} | "
                         f"{e['network']:.3f} | {e['points']} | {e['median_error_pct']:.1f}% | "
                         f"{e['median_error_at_peak_pct']:.1f}% |")
    for gen, e in doc["generations"].items():
        carry = "not measured (one GPU)" if e["carry_error_pct"] is None else f"{e['carry_error_pct']:.1f}% carried"
        lines.append(f"| {gen} ({', '.join(e['from'])}) | pooled | {e['compute']:.3f} | {e['memory']:.3f} | "
                     f"{e['network']:.3f} | | {e['median_error_pct']:.1f}% | {carry} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two models only (a smoke run; does not write the data file)")
    args = ap.parse_args(argv)
    from optimizer.model.measured import _aic, systems

    servers = yaml.safe_load((ROOT / "instances" / "hardware" / "aiconfigurator.yaml").read_text())["servers"]
    t0 = time.perf_counter()
    fits, by_gpu = {}, {}
    for gpu in sorted(systems()):
        for engine in ENGINES:
            pts, version = points(gpu, servers[gpu], engine, args.quick)
            if len(pts) < 6:
                continue
            x, e = fit(pts)
            peak = err(pts, np.zeros(3))
            c, m, n = (round(float(v), 3) for v in np.exp(x))
            fits.setdefault(gpu, {})[engine] = {"compute": c, "memory": m, "network": n, "version": str(version),
                                                "points": len(pts), "median_error_pct": round(e, 1),
                                                "median_error_at_peak_pct": round(peak, 1)}
            by_gpu.setdefault(gpu, []).extend(pts)
            print(f"{gpu:14s} {engine:7s} compute {c:.3f} memory {m:.3f} network {n:.3f}  "
                  f"median error {e:5.1f}% (at peak {peak:5.1f}%), {len(pts)} steps", flush=True)
    from optimizer.catalog import generation_of

    generations = generation_of()  # the catalog's `generation` field: a GPU the database lacks takes its generation's
    gens = {}
    for gen in sorted(set(generations.values())):
        members = [g for g in sorted(by_gpu) if generations.get(g) == gen]
        if not members:
            continue
        pooled = [p for g in members for p in by_gpu[g]]
        x, e = fit(pooled)
        carry = []
        for left in members if len(members) > 1 else ():
            xo, _ = fit([p for g in members if g != left for p in by_gpu[g]])
            carry.append(err(by_gpu[left], xo))
            print(f"{gen}: carried to {left} from the others: {carry[-1]:.1f}%", flush=True)
        c, m, n = (round(float(v), 3) for v in np.exp(x))
        gens[gen] = {"compute": c, "memory": m, "network": n, "from": members, "median_error_pct": round(e, 1),
                     "carry_error_pct": round(max(carry), 1) if carry else None}
    doc = {
        "source": "benchmarks/fit_efficiency.py: the analytic roofline's shares of peak (compute: tensor-core "
                  "FLOP/s, memory: HBM bytes/s, network: link bandwidth) least-squares fitted in log space to "
                  "the measured source's decode and prefill steps of Llama-3.1-8B/70B, Qwen3-32B and "
                  "Qwen3-30B-A3B (BF16, TP1-8); carry_error_pct: the worst median error of a generation's factors "
                  "fitted without one of its GPUs, on that GPU",
        "database": f"aiconfigurator-core {_aic()}",
        "generation_of": generations,
        "fits": fits,
        "generations": gens,
    }
    if not args.quick:
        (ROOT / "instances" / "hardware" / "efficiency.yaml").write_text(
            "# Generated by `python -m benchmarks.fit_efficiency`; do not edit by hand.\n"
            + yaml.safe_dump(doc, sort_keys=False, width=120), encoding="utf-8")
        res = ROOT / "benchmarks" / "results"
        res.mkdir(exist_ok=True)
        (res / "efficiency.json").write_text(json.dumps({**doc, "seconds": round(time.perf_counter() - t0, 1)},
                                                        indent=1))
    print(f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
