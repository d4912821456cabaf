"""Deployment benchmarks (run by hand: ``python benchmarks/bench_deployment.py``).

1. End-to-end CLI time on instances/qwen32b_128k.yaml (a fresh process, as a user runs it).
2. Solve time, status and gap of the cost objective on generated heterogeneous instances
   of 12, 48 and 200 sessions on 1, 4 and 16 HGX H100 servers (benchmarks/gen_deployment.py).
3. The sequence formulation: the latency objective, and the cost objective with a fault on
   any GPU (at 300 ms, stalling 200 ms; 50 % on time required), on the 12-session instances.

``--scale``: traffic at scale (anytime solve, :mod:`optimizer.deployment.anytime`), each case run
as a user runs it (``optimize FILE --time-limit T --format json --progress`` in a fresh process),
with ``max_batch: 1`` and with the default batching: 200 sessions each of its own length and
deadline on 16 HGX H100 (``generate_mixed``, seed 0, 80 % on time, 60 s); 1,000 sessions in 12
types on 64 servers (seed 0, 60 % on time: the LP relaxation shows at most 78.7 % can be, 60 s);
the first 5,000 requests of the Azure conversation trace on 64 servers (80 % on time, 120 s;
skipped when /work/shared/data is absent). Columns: time to the first plan (from the progress
table), final status, value, bound, gap, the command's wall time.

``--acceptance``: the issue's targets at 60 s (gap <= 5 % on 200 distinct sessions, <= 2 % on
1,000 in 12 types, a plan within 10 s), printed with whether each is met (exit 1 if not).

``--limits``: the command's wall time against ``--time-limit`` (+10 %) on the large cases the
tests run for their status and plan only.

``--batched``: layouts and batched decode (cost objective, default layouts, no batch limit):
24 sessions of mixed lengths on 2 HGX H100 (benchmarks/gen_deployment.generate_batched,
seeds 0-2) and the MoE instance instances/qwen3_30b_a3b_batched.yaml (16 sessions, 1 server).
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gen_deployment import generate, generate_batched  # noqa: E402
from optimizer.deployment.schema import build_problem  # noqa: E402
from optimizer.deployment.strategy import solve_deployment  # noqa: E402


def cli_time(repeats: int = 5) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "optimizer.cli", str(ROOT / "instances" / "qwen32b_128k.yaml"),
                        "--objective", "cost"], check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    t = cli_time()
    print(f"book instance, CLI end to end: median {statistics.median(t):.2f} s (min {min(t):.2f}, max {max(t):.2f}, {len(t)} runs)")
    print(f"{'sessions':>8} {'servers':>7} {'classes':>7} {'status':>9} {'cost':>9} {'gap':>8} {'solves':>6} {'time s':>7}")
    for n, s, limit in [(12, 1, 60), (48, 4, 60), (200, 16, 120)]:
        for seed in (0, 1, 2):
            raw = generate(n, s, seed)
            p = build_problem(raw, ROOT / "benchmarks" / "generated.yaml")
            t0 = time.perf_counter()
            out = solve_deployment(p, "cost", time_limit_s=limit)
            dt = time.perf_counter() - t0
            gap = "-" if out.stats.gap is None else f"{out.stats.gap * 100:.2f}%"
            val = "-" if out.value is None else f"{out.value:.4f}"
            print(f"{n:>8} {s:>7} {len(p.classes):>7} {out.status.value:>9} {val:>9} {gap:>8} {out.stats.solves:>6} {dt:>7.2f}")
    print(f"{'case':>22} {'seed':>4} {'status':>9} {'value':>10} {'gap':>8} {'time s':>7}")
    for case in ("latency", "cost, fault any GPU"):
        for seed in (0, 1, 2):
            raw = generate(12, 1, seed)
            if case.startswith("cost"):
                raw["faults"] = [{"at_ms": 300, "stall_ms": 200}]
                raw["workload"]["min_on_time_fraction"] = 0.5
            p = build_problem(raw, ROOT / "benchmarks" / "generated.yaml")
            t0 = time.perf_counter()
            out = solve_deployment(p, case.split(",")[0], time_limit_s=60)
            dt = time.perf_counter() - t0
            gap = "-" if out.stats.gap is None else f"{out.stats.gap * 100:.2f}%"
            val = "-" if out.value is None else f"{out.value:.4f}"
            print(f"{case:>22} {seed:>4} {out.status.value:>9} {val:>10} {gap:>8} {dt:>7.2f}")


def batched() -> None:
    """Layouts and batched decode: status, gap and solve time (time limit 60 s)."""
    print(f"{'case':>34} {'status':>8} {'cost':>7} {'gap':>5} {'plan':<32} {'time s':>6}")
    cases = [(f"24 sessions, 2 servers, seed {s}", build_problem(generate_batched(24, 2, s), ROOT / "benchmarks" / "generated.yaml"))
             for s in (0, 1, 2)]
    cases.append(("Qwen3-30B-A3B, 16 sessions, 1 server", build_problem(
        __import__("yaml").safe_load((ROOT / "instances" / "qwen3_30b_a3b_batched.yaml").read_text()),
        ROOT / "instances" / "qwen3_30b_a3b_batched.yaml")))
    for name, p in cases:
        t0 = time.perf_counter()
        out = solve_deployment(p, "cost", time_limit_s=60)
        dt = time.perf_counter() - t0
        plan = " + ".join(f"{i.lay.label()} b{i.max_batch}" for i in out.evaluation.plan.instances) if out.evaluation else "-"
        gap = "-" if out.stats.gap is None else f"{out.stats.gap * 100:.0f}%"
        print(f"{name:>34} {out.status.value:>8} {out.value:>7.4f} {gap:>5} {plan:<32} {dt:>6.2f}")


SHARED = ROOT.parent / "shared" / "data"
ROW = __import__("re").compile(r"│\s*([\d.]+)\s*│\s*([^│]+?)\s*│\s*([^│]+?)\s*│\s*([^│]+?)\s*│\s*([^│]+?)\s*│")


def scale_cases():
    """(name, raw instance, time limit s) of the ``--scale`` benchmark."""
    from benchmarks.gen_deployment import AZURE_CONV, generate_azure, generate_mixed

    out = []
    for mb in (1, None):
        tag = "max_batch 1" if mb == 1 else "batching"
        out.append((f"200 distinct, 16 servers, {tag}", generate_mixed(200, 16, seed=0, max_batch=mb), 60))
        out.append((f"1000 in 12 types, 64 servers, {tag}",
                    generate_mixed(1000, 64, seed=0, types=12, fraction=0.6, max_batch=mb), 60))
    if (SHARED / AZURE_CONV).exists():
        for mb in (1, None):
            tag = "max_batch 1" if mb == 1 else "batching"
            out.append((f"Azure conv 5000, 64 servers, {tag}", generate_azure(SHARED / AZURE_CONV, max_batch=mb), 120))
    return out


def run_scale_case(raw: dict, limit: float, folder: Path) -> dict:
    """One ``--scale`` case through the CLI; returns first-plan time, status, value, bound, gap, wall."""
    import json

    import yaml

    path = folder / "case.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "optimizer.cli", str(path), "--time-limit", str(limit), "--format",
                          "json", "--progress"], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    first = next((float(m.group(1)) for m in ROW.finditer(res.stderr) if m.group(3) not in ("-", "incumbent")), None)
    d = json.loads(res.stdout) if res.stdout.strip() else {}
    o = d.get("objective", {})
    return {"first_s": first, "status": d.get("status", f"exit {res.returncode}"), "value": o.get("value"),
            "bound": o.get("bound"), "gap": o.get("gap"), "wall_s": wall, "formulation": d.get("solver", {}).get("formulation")}


def scale() -> None:
    """Traffic at scale: first plan, gap and wall time per case (see the module docstring)."""
    import tempfile

    print(f"{'case':>40} {'limit':>5} {'1st plan s':>10} {'status':>8} {'cost':>8} {'bound':>8} {'gap':>7} {'wall s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, raw, limit in scale_cases():
            r = run_scale_case(raw, limit, Path(tmp))
            f = lambda v, d=4: "-" if v is None else f"{v:.{d}f}"
            gap = "-" if r["gap"] is None else f"{r['gap'] * 100:.2f}%"
            print(f"{name:>40} {limit:>5} {f(r['first_s'], 2):>10} {r['status']:>8} {f(r['value'])} {f(r['bound'])} "
                  f"{gap:>7} {r['wall_s']:>7.1f}")


def _timed_cli(args: list, limit: float) -> tuple[float, int, dict]:
    """(wall s, exit code, JSON) of ``optimize ARGS --time-limit LIMIT --format json`` in a fresh process."""
    import json

    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "optimizer.cli", *map(str, args), "--time-limit", str(limit),
                          "--format", "json"], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    return wall, res.returncode, (json.loads(res.stdout) if res.stdout.strip().startswith("{") else {})


def acceptance() -> bool:
    """The issue's acceptance targets at 60 s (moved here from the tests: they measure the
    machine as much as the code). Each case as a user runs it (a fresh process, ``--progress``):
    200 distinct sessions one at a time: a plan within 10 s, gap <= 5 % at 60 s; 1,000 sessions
    in 12 types one at a time: gap <= 2 % at 60 s; 1,000 in 12 types, one at a time and batched,
    with ``--time-limit 10``: a plan with its bound within 10 s. Every command within its limit
    + 10 %. Prints the figures and whether each target is met; returns True when all are."""
    import tempfile

    from benchmarks.gen_deployment import generate_mixed

    cases = [("200 distinct, 1 at a time", generate_mixed(200, 16, seed=0, max_batch=1), 60, 0.05),
             ("1000 in 12 types, 1 at a time", generate_mixed(1000, 64, seed=0, types=12, fraction=0.6, max_batch=1),
              60, 0.02),
             ("1000 in 12 types, 1 at a time", generate_mixed(1000, 64, seed=0, types=12, fraction=0.6, max_batch=1),
              10, None),
             ("1000 in 12 types, batching", generate_mixed(1000, 64, seed=0, types=12, fraction=0.6, max_batch=None),
              10, None)]
    ok_all = True
    print(f"{'case':>32} {'limit':>5} {'status':>8} {'1st plan s':>10} {'gap':>7} {'target':>7} {'wall s':>7}  met")
    with tempfile.TemporaryDirectory() as tmp:
        for name, raw, limit, target in cases:
            r = run_scale_case(raw, limit, Path(tmp))
            ok = (r["status"] in ("feasible", "optimal") and r["bound"] is not None and r["first_s"] is not None
                  and r["first_s"] <= 10.0 and r["wall_s"] <= limit * 1.1
                  and (target is None or (r["gap"] is not None and r["gap"] <= target)))
            ok_all &= ok
            gap = "-" if r["gap"] is None else f"{r['gap'] * 100:.2f}%"
            tgt = "plan" if target is None else f"{target * 100:.0f}%"
            first = "-" if r["first_s"] is None else f"{r['first_s']:.2f}"
            print(f"{name:>32} {limit:>5} {r['status']:>8} {first:>10} {gap:>7} {tgt:>7} {r['wall_s']:>7.1f}  "
                  f"{'yes' if ok else 'NO'}")
    return ok_all


def limits() -> bool:
    """Does the command keep ``--time-limit`` (start-up included, +10 %)? The wall-clock checks
    moved here from the tests (tests/test_deployment_anytime.py, tests/test_deployment_fresh_user.py
    keep the functional part: status, plan, notes). Prints wall time against limit per case."""
    import tempfile

    import yaml

    from benchmarks.gen_deployment import generate, generate_mixed

    def write(folder, name, raw):
        path = Path(folder) / name
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path

    ok_all = True
    print(f"{'case':>58} {'limit':>5} {'exit':>4} {'status':>10} {'wall s':>7}  within +10 %")
    with tempfile.TemporaryDirectory() as tmp:
        book = ROOT / "instances" / "qwen32b_128k.yaml"
        cases = [
            ("200 distinct, 1 at a time", [write(tmp, "a.yaml", generate_mixed(200, 16, seed=0, max_batch=1))], 5),
            ("200 distinct, batching", [write(tmp, "b.yaml", generate_mixed(200, 16, seed=0, max_batch=None))], 5),
            ("200 distinct, latency objective",
             [write(tmp, "a.yaml", generate_mixed(200, 16, seed=0, max_batch=1)), "--objective", "latency"], 5),
            ("100,000 identical sessions on 64 servers",
             [book, "--set", "workload.sessions.0.context_tokens=1000", "--set", "workload.sessions.0.count=100000",
              "--set", "workload.min_on_time_fraction=0", "--set", "hardware.servers=64"], 5),
            ("200 distinct on 1 server (memory: infeasible)",
             [write(tmp, "m.yaml", generate_mixed(200, 1, seed=1, max_batch=1))], 10),
            ("200 distinct, all on time (infeasible)",
             [write(tmp, "o.yaml", generate_mixed(200, 16, seed=1, fraction=1.0, max_batch=1))], 10),
            ("300 distinct on 2 servers (infeasible)", [write(tmp, "i.yaml", generate_mixed(300, 2, seed=0))], 5),
            ("48 sessions in 6 types, latency objective",
             [write(tmp, "l.yaml", generate(48, 4, seed=1)), "--objective", "latency"], 10),
            ("200 distinct with a fault", [write(tmp, "f.yaml", {**generate_mixed(200, 16, seed=0),
                                                                 "faults": [{"at_ms": 20, "stall_ms": 40}]})], 10),
            ("deepseek_v3_ep32.yaml (expert placement)", [ROOT / "instances" / "deepseek_v3_ep32.yaml"], 3),
        ]
        for name, args, limit in cases:
            wall, code, d = _timed_cli(args, limit)
            ok = wall <= limit * 1.1
            ok_all &= ok
            print(f"{name:>58} {limit:>5} {code:>4} {d.get('status', '-'):>10} {wall:>7.2f}  {'yes' if ok else 'NO'}")
    # tests/test_deployment_fresh_user.py::test_deadline_equal_to_a_finish_time_ends_at_once: LNS
    # used to run out the default 60 s looking for the last 1e-7 (target: well under 10 s)
    raw = yaml.safe_load(book.read_text())
    raw["model"]["config"] = str(ROOT / "instances" / "models" / "qwen3-32b.json")
    first = solve_deployment(build_problem(raw, book), "cost")
    raw["workload"]["sessions"][0]["deadline_ms"] = max(s.finish_s for s in first.evaluation.nominal.sessions) * 1e3
    raw["workload"]["min_on_time_fraction"] = 1.0
    t0 = time.perf_counter()
    out = solve_deployment(build_problem(raw, book), "cost")
    wall = time.perf_counter() - t0
    ok = wall < 10.0
    ok_all &= ok
    print(f"{'deadline equal to a finish time (API, no limit)':>58} {'-':>5} {'-':>4} {out.status.value:>10} "
          f"{wall:>7.2f}  {'yes (< 10 s)' if ok else 'NO (>= 10 s)'}")
    return ok_all


if __name__ == "__main__":
    if "--acceptance" in sys.argv:
        sys.exit(0 if acceptance() else 1)
    elif "--limits" in sys.argv:
        sys.exit(0 if limits() else 1)
    elif "--scale" in sys.argv:
        scale()
    elif "--batched" in sys.argv:
        batched()
    else:
        main()
