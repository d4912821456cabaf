"""Supernode sizing solve times (run by hand: ``python benchmarks/bench_supernode.py``).

Needs ``../shared/data`` (the DeepSeek-V4.1-Flash inventory). For each case it reports the
options evaluated, the median wall time (of ``--repeats`` runs) of the option evaluation (the
performance model over every batch size), of the lexicographic CP-SAT solve (all stages), of
the explanations (bindings, alternatives) and of the flip-threshold search, and whether the
primary stage was proven optimal. Machine-dependent; the README quotes one run.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.budget import Budget  # noqa: E402
from optimizer.schema_base import read_yaml  # noqa: E402
from optimizer.supernode import PIPELINE  # noqa: E402
from optimizer.supernode.explain import THRESHOLD_TIME_S, alternatives, bindings, flip_thresholds  # noqa: E402
from optimizer.supernode.perf import evaluate_all  # noqa: E402
from optimizer.supernode.schema import load  # noqa: E402
from optimizer.supernode.solve import solve  # noqa: E402

CHAPTER = ROOT / "instances" / "supernode_v41_flash.yaml"


def cases() -> list[tuple[str, dict, str]]:
    base = read_yaml(CHAPTER)

    def mk(**sn):
        raw = copy.deepcopy(base)
        raw["supernode"].update(sn)
        return raw

    all_tiers = dict(table_tiers=["hbm", "host", "pool", "rom", "sram"], kv_tiers=["hbm", "host", "pool"])
    return [
        ("chapter: 256 cards, 4 sizes, tables in HBM", mk(), "throughput"),
        ("chapter, sessions objective", mk(), "sessions"),
        ("256 cards, 4 sizes, all tiers", mk(**all_tiers), "throughput"),
        ("256 cards, 4 sizes, all tiers + NIC-joined servers", mk(allow_cross_server=True, **all_tiers), "throughput"),
        ("1024 cards, 7 sizes, all tiers, target 200k sessions, cards",
         mk(cards=1024, sizes=[8, 16, 32, 64, 128, 256, 512], allow_cross_server=True, target_sessions=200000,
            **all_tiers), "cards"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{'case':62s} {'options':>7s} {'eval s':>7s} {'solve s':>8s} {'explain s':>9s} {'flips s':>8s}  status  value")
    for name, raw, objective in cases():
        t_eval, t_solve, t_expl, t_flip = [], [], [], []
        for _ in range(args.repeats):
            p = load(raw, CHAPTER, objective)
            t0 = time.perf_counter()
            results = evaluate_all(p)
            t1 = time.perf_counter()
            res = solve(p, Budget.unlimited(), results=results)
            t2 = time.perf_counter()
            res = dataclasses.replace(res, evaluation=PIPELINE.evaluate(p, res.plan))
            bindings(p, res)
            alternatives(p, res)
            t3 = time.perf_counter()
            flip_thresholds(p, res, Budget.seconds(THRESHOLD_TIME_S))
            t4 = time.perf_counter()
            t_eval.append(t1 - t0)
            t_solve.append(t2 - t1)
            t_expl.append(t3 - t2)
            t_flip.append(t4 - t3)
        med = statistics.median
        print(f"{name:62s} {len(results):7d} {med(t_eval):7.3f} {med(t_solve):8.3f} {med(t_expl):9.3f} "
              f"{med(t_flip):8.3f}  {res.stages[0][1].value:7s} {res.value:,.3f} (bound {res.bound:,.3f})")


if __name__ == "__main__":
    main()
