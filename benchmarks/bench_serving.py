"""Serving planner times (run by hand: ``python benchmarks/bench_serving.py``).

For each case: worker configurations evaluated, and the median (of ``--repeats`` runs) of the
analytic model (every configuration's largest rate), of the MILPs plus the SimPy re-checks (all
modes and rates), and of the whole command in a fresh process (``optimize INSTANCE --format
json``: imports, input, model, solves, simulations, report). Machine-dependent; the README quotes
one run on the 2-core machine.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.schema_base import read_yaml  # noqa: E402
from optimizer.serving import load_problem, solve_instance  # noqa: E402
from optimizer.serving.perf import ServingModel  # noqa: E402
from optimizer.serving.solve import MODE_ROLES  # noqa: E402

INSTANCES = ROOT / "instances"


def cases() -> list[tuple[str, Path, dict]]:
    llama = INSTANCES / "serving_llama70b_h100.yaml"
    sweep = copy.deepcopy(read_yaml(llama))
    sweep["serving"]["traffic"]["rate_rps"] = [2, 5, 10, 20, 40]
    return [
        ("Llama-3.1-70B, 64 H100, 10 req/s, both modes", llama, read_yaml(llama)),
        ("Llama-3.1-70B, 64 H100, sweep of 5 rates, both modes", llama, sweep),
        ("Qwen3-30B-A3B, 16 H100 + 16 H200, 2 classes, both modes, $/h", INSTANCES / "serving_qwen3_30b_a3b_mixed_pools.yaml",
         read_yaml(INSTANCES / "serving_qwen3_30b_a3b_mixed_pools.yaml")),
        ("DeepSeek-V3 FP8, 32 H200, disaggregated", INSTANCES / "serving_deepseek_v3_disagg.yaml",
         read_yaml(INSTANCES / "serving_deepseek_v3_disagg.yaml")),
    ]


def _cli_seconds(path: Path, raw: dict) -> float:
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "inst.yaml"
        raw = copy.deepcopy(raw)
        raw["model"]["config"] = str((path.parent / raw["model"]["config"]).resolve())
        f.write_text(yaml.safe_dump(raw))
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "optimizer.cli", str(f), "--format", "json"], cwd=ROOT,
                           capture_output=True, text=True)
        dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print("| case | configurations | model s | solve + simulate s | end to end s | best plan | GPUs | simulated attainment |")
    print("|---|---|---|---|---|---|---|---|")
    for name, path, raw in cases():
        t_model, t_rest, t_cli = [], [], []
        for _ in range(args.repeats):
            p = load_problem(raw, path)
            t0 = time.perf_counter()
            modes = ("aggregated", "disaggregated") if p.mode == "both" else (p.mode,)
            ws = ServingModel(p).workers(tuple(r for m in modes for r in MODE_ROLES[m]))
            t_model.append(time.perf_counter() - t0)
            t1 = time.perf_counter()
            rep = solve_instance(p)
            d = rep.to_dict()
            t_rest.append(time.perf_counter() - t1 - t_model[-1])
            t_cli.append(_cli_seconds(path, raw))
        last = d["plan"]["rates"][-1]
        best = last["modes"][last["best_mode"]]
        groups = " + ".join(f"{g['count']}x {g['role']} {g['layout']} {g['gpu']}" for g in best["workers"])
        print(f"| {name} | {len(ws)} | {statistics.median(t_model):.2f} | {max(0.0, statistics.median(t_rest)):.2f} | "
              f"{statistics.median(t_cli):.2f} | {last['best_mode']} at {last['rate_rps']:g} req/s: {groups} | "
              f"{best['gpus']} | {best['simulated']['attainment']:.1%} |")


def _wall_of_command(args: list, limit: float) -> tuple[float, int, str]:
    """(wall s, exit code, status) of ``optimize ARGS --time-limit LIMIT --format json`` in a fresh process."""
    import json

    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "optimizer.cli", *map(str, args), "--time-limit", str(limit),
                        "--format", "json"], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    status = json.loads(r.stdout).get("status", "-") if r.stdout.strip().startswith("{") else "-"
    return wall, r.returncode, status


def limits() -> bool:
    """``--limits``: 200,000 simulated requests under a time limit (the wall-clock checks moved
    here from tests/test_serving_queueing.py and tests/test_deployment_fresh_user.py): the
    planner call with ``time_limit_s=3`` and the command with ``--time-limit 5``, each against
    its limit + 10 %. Prints the figures; True when both hold."""
    raw = yaml.safe_load((INSTANCES / "serving_llama70b_h100.yaml").read_text())
    raw["serving"]["simulation"] = {"requests": 200_000}
    raw["model"]["config"] = str(INSTANCES / "models" / "llama-3.1-70b.json")
    ok_all = True
    t0 = time.perf_counter()
    d = solve_instance(load_problem(raw, INSTANCES / "serving_llama70b_h100.yaml"), time_limit_s=3.0).to_dict()
    wall = time.perf_counter() - t0
    ok = wall <= 3.0 * 1.1
    ok_all &= ok
    print(f"solve_instance, 200,000 requests, time_limit_s=3: {wall:.2f} s, {d['status']}, "
          f"cut short {len(d['solver']['cut_short'])}, within +10 %: {'yes' if ok else 'NO'}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sv.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        wall, code, status = _wall_of_command([path], 5)
    ok = wall <= 5 * 1.1
    ok_all &= ok
    print(f"optimize (200,000 requests) --time-limit 5: {wall:.2f} s, exit {code}, {status}, "
          f"within +10 %: {'yes' if ok else 'NO'}")
    return ok_all


if __name__ == "__main__":
    if "--limits" in sys.argv:
        sys.exit(0 if limits() else 1)
    main()
