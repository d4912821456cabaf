"""Build-out solve times for a few hall sizes (run by hand: ``python benchmarks/bench_buildout.py``).

For each size and objective it reports the median wall time (of ``--repeats`` runs) of the
lexicographic solve (all stages) and of the explanation what-if solves, plus the model size
(rack patterns, leaf splits). Machine-dependent; the README quotes one run.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.buildout import evaluate_plan  # noqa: E402
from optimizer.buildout.explain import bindings  # noqa: E402
from optimizer.buildout.model import build  # noqa: E402
from optimizer.buildout.schema import load  # noqa: E402
from optimizer.buildout.solve import solve  # noqa: E402

FABRIC = {"switch_radix": 64, "port_bandwidth_gb_s": 50, "gpu_links": 1, "max_oversubscription": 3.0,
          "second_tier_power_kw": 25, "one_tier_max_gpus": 64}
ALL4 = [{"name": "hgx-h100"}, {"name": "hgx-h200"}, {"name": "dgx-b200"}, {"name": "dgx-a100", "max_count": 64}]


def cases() -> list[tuple[str, dict]]:
    base = yaml.safe_load((ROOT / "instances" / "hgx_h100_120kw.yaml").read_text())

    def mk(budget_kw, types, unit, fabric, target, fixed=0.0):
        raw = copy.deepcopy(base)
        b = raw["buildout"]
        b.update(power_budget_kw=float(budget_kw), server_types=types, install_unit_servers=unit,
                 target_gpus=target, fixed_power_kw=fixed)
        if fabric:
            b["fabric"] = dict(FABRIC)
        return raw

    return [
        ("120 kW, 1 type", mk(120, [{"name": "hgx-h100"}], 1, False, 64)),
        ("1 MW, 3 types, fabric", mk(1000, ALL4[1:], 2, True, 512, 60)),
        ("10 MW, 4 types, fabric", mk(10_000, ALL4, 4, True, 5_000, 400)),
        ("50 MW, 4 types, fabric", mk(50_000, ALL4, 4, True, 25_000, 2_000)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print("| instance | objective | rack patterns | leaf splits | GPUs | racks (air/liquid) | status | "
          "solve s (median) | explain s (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, raw in cases():
        for objective in ("gpus", "cost", "racks"):
            p, obj = load(raw, label, objective)
            _nm, ctx = build(p)
            ts, te = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                res = solve(p, obj, time_limit_s=120)
                t1 = time.perf_counter()
                ev = evaluate_plan(p, res)
                assert not ev.violations, ev.violations
                bindings(p, obj, res.value, res.plan, ev)
                t2 = time.perf_counter()
                ts.append(t1 - t0)
                te.append(t2 - t1)
            print(f"| {label} | {objective} | {len(ctx.patterns)} | {len(ctx.splits)} | {ev.gpus} | "
                  f"{ev.racks['air']}/{ev.racks['liquid']} | {res.status.value} | "
                  f"{statistics.median(ts):.3f} | {statistics.median(te):.3f} |", flush=True)


if __name__ == "__main__":
    main()
