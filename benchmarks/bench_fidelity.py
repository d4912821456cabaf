"""Fidelity of the step-time sources against aiconfigurator-core's 5,222 measured serving runs.

``python -m benchmarks.bench_fidelity [--all]``: predicts the dense aggregated rows on H100 and H200
(Qwen3-32B, Llama-3.1-8B, Llama-3.1-70B; every engine present) with the analytic and the measured
source (closed-loop simulation of the row's concurrency, :mod:`optimizer.serving.fidelity`) and
prints the median absolute TTFT / TPOT error per source, per group, and the rows not predicted.
``--all``: every aggregated row of the file (MoE models included). Nothing is fitted on the rows.
Writes ``benchmarks/results/fidelity.json`` (rows and groups) for the docs.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from importlib.resources import files
from pathlib import Path

DENSE = ("Qwen/Qwen3-32B", "Llama-3.1-8B", "Llama-3.1-70B")


def silicon_sample() -> Path:
    return Path(str(files("aiconfigurator_core") / "systems" / "silicon_sample.csv"))


def select(all_rows: bool) -> Path:
    """A CSV of the rows benchmarked (written to a temporary file)."""
    src = silicon_sample()
    out = Path(tempfile.mkdtemp()) / "rows.csv"
    with src.open(newline="") as fh, out.open("w", newline="") as oh:
        r = csv.DictReader(fh)
        w = csv.DictWriter(oh, r.fieldnames)
        w.writeheader()
        for row in r:
            if row["mode"] != "agg":
                continue
            if not all_rows and not (row["system"] in ("h100_sxm", "h200_sxm") and any(m in row["model_path"] for m in DENSE)):
                continue
            w.writerow(row)
    return out


def main(argv=None) -> dict:
    from optimizer.serving import fidelity as fd

    ap = argparse.ArgumentParser()
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args(argv)
    path = select(a.all)
    t0 = time.perf_counter()
    sources = ("analytic", "measured")
    rows = fd.predict(fd.read_rows(path), sources, path)
    wall = time.perf_counter() - t0
    res = {"rows": [r.to_dict() for r in rows], "groups": fd.groups(rows, sources),
           "overall": fd.overall(rows, sources), "wall_s": wall}
    out = Path(__file__).parent / "results" / ("fidelity_all.json" if a.all else "fidelity.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"{len(rows)} rows, {wall:.0f} s")
    print("| source | rows predicted | TTFT median abs. error | TPOT median abs. error |")
    print("|---|---|---|---|")
    for s, o in res["overall"].items():
        print(f"| {s} | {o['n']} | {o['ttft_median']:.0%} | {o['tpot_median']:.0%} |")
    print()
    print("| GPU | engine | model | rows | analytic TTFT / TPOT | measured TTFT / TPOT |")
    print("|---|---|---|---|---|---|")
    for g in res["groups"]:
        e = g["errors"]
        c = lambda s: f"{e[s]['ttft_median']:.0%} / {e[s]['tpot_median']:.0%}" if s in e else "not predicted"  # noqa: E731
        print(f"| {g['system']} | {g['engine']} | {g['model']} | {g['rows']} | {c('analytic')} | {c('measured')} |")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
