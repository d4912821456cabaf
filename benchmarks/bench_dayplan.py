"""Day-plan times (run by hand: ``python benchmarks/bench_dayplan.py [--repeats 3]``).

instances/serving_azure_conv_day.yaml (12 five-minute windows of the Azure conversation trace,
Llama-3.1-70B on 64 H100, both modes; needs ../shared/data): the median (of ``--repeats`` runs) of
the per-window analytic models, of the whole in-process solve (models, every MILP of the
simulation loop, the per-window simulations, the static plans) and of the whole command in a
fresh process (``optimize INSTANCE --format json``). Writes benchmarks/results/dayplan.json.
Machine-dependent; docs/dayplan.md quotes one run on the 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.budget import Budget  # noqa: E402
from optimizer.schema_base import read_yaml  # noqa: E402
from optimizer.serving import PIPELINE  # noqa: E402

INSTANCE = ROOT / "instances" / "serving_azure_conv_day.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if not (ROOT.parent / "shared" / "data").exists():
        sys.exit("needs ../shared/data (the Azure LLM inference trace)")
    solve, model, cli, milp = [], [], [], []
    out = None
    for _ in range(args.repeats):
        p = PIPELINE.load(read_yaml(INSTANCE), INSTANCE)
        t0 = time.perf_counter()
        sol = PIPELINE.solve(p, Budget.unlimited())
        solve.append(time.perf_counter() - t0)
        model.append(sol.model_s)
        milp.append(sum(m.result.time_s for m in sol.modes.values()))
        out = PIPELINE.report(p, sol, None).to_dict()
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "optimizer.cli", str(INSTANCE), "--format", "json"], cwd=ROOT,
                       capture_output=True, check=False)
        cli.append(time.perf_counter() - t0)
    plan = out["plan"]
    row = {"instance": INSTANCE.name, "windows": plan["windows"], "best_mode": plan["best_mode"],
           "gpu_hours": plan["gpu_hours"], "static_gpu_hours": plan["static_gpu_hours"], "saving": plan["saving"],
           "modes": {m: {"gpu_hours": d["gpu_hours"], "bound": d["bound"], "gap": d["gap"], "milp_solves": d["milp_solves"],
                         "static_gpu_hours": d["static"]["gpu_hours"], "saving": d["saving"],
                         "min_attainment": min(w["attainment"] for w in d["windows"] if w["attainment"] is not None)}
                     for m, d in plan["modes"].items() if "windows" in d},
           "median_s": {"window_models": statistics.median(model), "last_milps": statistics.median(milp),
                        "solve": statistics.median(solve), "command": statistics.median(cli)},
           "repeats": args.repeats}
    (ROOT / "benchmarks" / "results" / "dayplan.json").write_text(json.dumps(row, indent=2) + "\n")
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
