"""End-to-end command times, as a user runs them (run by hand: ``python -m benchmarks.bench_cli``).

Each row is one fresh ``optimize`` process (Python start, imports, solve, explanations, report):
the book instance, the 48-session deployment cases of the answers issue (6 groups of sessions of
mixed lengths on 4 HGX H100, cost; ``benchmarks/gen_deployment.py`` seeds 0-2) and the batched
eight-session case. Prints a markdown table: command, status, objective, whole run (median of
``--repeats``), the solver's own ``solver.time_s``, and which explanation parts were cut short.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gen_deployment import generate  # noqa: E402


def run(args: list[str], repeats: int) -> tuple[dict, list[float]]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "optimizer.cli", *args, "--format", "json"],
                           capture_output=True, text=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
        out = json.loads(p.stdout)
    return out, times


def cases(folder: Path) -> list[tuple[str, list[str]]]:
    out = [("book: qwen32b_128k, cost", ["instances/qwen32b_128k.yaml", "--objective", "cost"]),
           ("eight 8K sessions batched (qwen32b_batched_8k)", ["instances/qwen32b_batched_8k.yaml"])]
    for seed in (0, 1, 2):
        path = folder / f"sessions48_seed{seed}.yaml"
        path.write_text(yaml.safe_dump(generate(48, 4, seed), sort_keys=False))
        out.append((f"48 sessions, 6 types, 4 HGX H100, cost, seed {seed}", [str(path), "--objective", "cost"]))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    print("| case | status | objective | whole command (median) | solver.time_s | cut short |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for label, args in cases(Path(tmp)):
            d, times = run(args, a.repeats)
            o = d["objective"]
            val = "-" if o["value"] is None else f"{o['value']:.4g} {o['unit']}"
            cut = ", ".join(d["solver"].get("cut_short") or []) or "-"
            print(f"| {label} | {d['status']} | {val} | {statistics.median(times):.2f} s | "
                  f"{d['solver']['time_s']:.2f} s | {cut} |")


if __name__ == "__main__":
    main()
