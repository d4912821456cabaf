"""Pareto-front and sweep times (run by hand: ``python benchmarks/bench_pareto.py``).

Pareto: ``--points`` TPOT targets x both modes for Llama-3.1-70B on up to 64 H100
(``instances/serving_llama70b_h100.yaml``), with the warm start (one ServingModel retargeted
from target to target: step-time tables computed once) and without it (a fresh model per
solve); the median of ``--repeats`` runs. Also writes the front figure to ``docs/pareto_llama70b_h100.png``
with ``--figure``. Sweep: the 48-point grid ``instances/sweep_llama70b_h100_h200.yaml`` (with the
SimPy re-checks) on the local process pool and on a Dask LocalCluster, wall time of each.
Machine-dependent; the README quotes one run on the 2-core machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.schema_base import read_yaml  # noqa: E402
from optimizer.serving import load_problem  # noqa: E402
from optimizer.serving.pareto import MODES, mark_front, pareto, plot, solve_point  # noqa: E402
from optimizer.serving.perf import ServingModel  # noqa: E402
from benchmarks.bench_serving import _wall_of_command  # noqa: E402  (one copy of the fresh-process timer)

INSTANCES = ROOT / "instances"
LLAMA = INSTANCES / "serving_llama70b_h100.yaml"


def cold(p, points: int) -> float:
    """Same solves, a fresh ServingModel per point (no warm start)."""
    from optimizer.serving.pareto import default_tpot_targets_ms

    t0 = time.perf_counter()
    for mode in MODES:
        pts = [solve_point(ServingModel(replace(p, rates=(p.rates[0],))), mode, t, p.ttft_s * 1e3)
               for t in default_tpot_targets_ms(p, points)]
        mark_front(pts)
    return time.perf_counter() - t0


def bench_pareto(points: int = 20, repeats: int = 3) -> list[dict]:
    p = load_problem(read_yaml(LLAMA), LLAMA)
    warm = [pareto(p, points=points).time_s for _ in range(repeats)]
    res = pareto(p, points=points)
    cold_s = [cold(p, points) for _ in range(repeats)]
    front = sum(len(c.front) for c in res.curves)
    return [{"case": f"Llama-3.1-70B, 64 H100, {points} TPOT targets x 2 modes", "solves": res.solves,
             "front_points": front, "warm_s": statistics.median(warm), "cold_s": statistics.median(cold_s)}]


def bench_sweep(workers: int = 2) -> list[dict]:
    from distributed import LocalCluster

    from optimizer.sweep import load_grid, run_sweep

    g = load_grid(INSTANCES / "sweep_llama70b_h100_h200.yaml")
    out = []
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        a = run_sweep(g, Path(d) / "local", workers=workers, progress=False)
        out.append({"case": f"48-point grid, local pool ({workers} processes)", "seconds": time.perf_counter() - t0,
                    "rows": len(a.rows)})
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as c:
            t0 = time.perf_counter()
            b = run_sweep(g, Path(d) / "dask", scheduler=c.scheduler_address, progress=False)
            out.append({"case": f"48-point grid, Dask LocalCluster ({workers} worker processes)",
                        "seconds": time.perf_counter() - t0, "rows": len(b.rows), "same_rows": a.rows == b.rows})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--points", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--figure", action="store_true", help="write docs/pareto_llama70b_h100.png")
    ap.add_argument("--no-sweep", action="store_true")
    a = ap.parse_args()
    print("| case | solves | front points | warm start, s | fresh model per solve, s |")
    print("|---|---|---|---|---|")
    for r in bench_pareto(a.points, a.repeats):
        print(f"| {r['case']} | {r['solves']} | {r['front_points']} | {r['warm_s']:.2f} | {r['cold_s']:.2f} |")
    if a.figure:
        p = load_problem(read_yaml(LLAMA), LLAMA)
        (ROOT / "docs").mkdir(exist_ok=True)
        plot(pareto(p, points=a.points), ROOT / "docs" / "pareto_llama70b_h100.png")
    if not a.no_sweep:
        print()
        print("| case | rows | wall s | same rows as local |")
        print("|---|---|---|---|")
        for r in bench_sweep():
            print(f"| {r['case']} | {r['rows']} | {r['seconds']:.1f} | {r.get('same_rows', '')} |")


def limits() -> bool:
    """``--limits``: ``--pareto ttft --pareto-points 200 --time-limit 3`` (22.7 s once; the
    wall-clock check moved here from tests/test_pareto.py) against its limit + 10 %."""
    with tempfile.TemporaryDirectory() as tmp:
        wall, code, status = _wall_of_command([LLAMA, "--pareto", "ttft", "--pareto-points", "200", "--output",
                                               Path(tmp) / "par"], 3)
    ok = wall <= 3 * 1.1
    print(f"optimize serving_llama70b_h100.yaml --pareto ttft --pareto-points 200 --time-limit 3: {wall:.2f} s, "
          f"exit {code}, {status}, within +10 %: {'yes' if ok else 'NO'}")
    return ok


if __name__ == "__main__":
    if "--limits" in sys.argv:
        sys.exit(0 if limits() else 1)
    main()
