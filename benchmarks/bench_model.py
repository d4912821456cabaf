"""Speed of the shared performance model (run by hand: ``python benchmarks/bench_model.py``).

Measures what a simulator or evaluator calls per decode step: ``PerfModel.step`` for a batch of
active sessions on a few layouts, the single-session vectorised path, and the layout enumeration.
Uses Qwen3-235B-A22B from ../shared/data when present, else the transcribed Qwen3-32B.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from optimizer.model import Layout, PerfModel, enumerate_layouts, hardware_from_catalog, read_hf_config

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "models" / "Qwen--Qwen3-235B-A22B.config.json"


def _per_call(fn, n: int) -> float:
    fn()  # warm up (the first AllReduce call imports the collectives module)
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def main() -> None:
    cfg = SHARED if SHARED.exists() else REPO / "instances" / "models" / "qwen3-32b.json"
    spec = read_hf_config(cfg)
    pm = PerfModel(spec, hardware_from_catalog("h100-sxm", "hgx-h100"), 2.0, 2.0, 2 * 2 ** 30)
    rng = np.random.default_rng(0)
    print(f"model {spec.name} ({spec.kind}) from {cfg.name}")
    for lay in [Layout.tp(8), Layout(2, 4, 2, 4) if spec.moe else Layout(2, 4, 2, 1), Layout(4, 1, 4, 1, pp=2)]:
        for n in (1, 64):
            pos = rng.integers(0, 30000, n)
            t = _per_call(lambda: pm.step(lay, pos, microbatches=2), 300)
            print(f"step {lay.label():<18} {n:>3} sessions: {t * 1e6:8.1f} us per call")
    pos = np.arange(0, 4096)
    t = _per_call(lambda: pm.single_session_step_s(Layout.tp(8), pos), 50)
    print(f"single-session path, 4096 positions: {t * 1e3:.2f} ms per call")
    t0 = time.perf_counter()
    count = sum(1 for _ in enumerate_layouts(spec, 64))
    print(f"enumerate_layouts up to 64 GPUs: {count} layouts in {time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    main()
