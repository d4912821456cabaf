"""Helpers for the experts tests: write instances and traces, run the CLI, an independent evaluator."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import yaml
from click.testing import CliRunner

from optimizer.cli import main
from optimizer.experts.traces import lognormal_loads

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
ESFT = SHARED / "expert_load" / "esft"


def write_instance(folder: Path, trace: str, **fields) -> Path:
    exp = {"trace": trace, "num_gpus": 4, "num_nodes": 2, "slots_per_gpu": 3}
    exp.update(fields)
    p = folder / "inst.yaml"
    p.write_text(yaml.safe_dump({"name": "test", "experts": exp}))
    return p


def run_cli(*args: str):
    res = CliRunner().invoke(main, [str(a) for a in args])
    return res.exit_code, res.output


def run_json(*args: str) -> tuple[int, dict]:
    """Exit code and the JSON on stdout (warnings go to stderr)."""
    res = CliRunner().invoke(main, [str(a) for a in args] + ["--format", "json"])
    return res.exit_code, json.loads(res.stdout)


def gpu_loads_from_phy2log(phy2log_row, w, slots_per_gpu: int, shares=None) -> list[float]:
    """Independent evaluator: GPU loads from an EPLB phy2log row, even split unless shares."""
    counts: dict[int, int] = {}
    for e in phy2log_row:
        counts[e] = counts.get(e, 0) + 1
    loads = []
    for g in range(len(phy2log_row) // slots_per_gpu):
        total = 0.0
        for r in range(g * slots_per_gpu, (g + 1) * slots_per_gpu):
            e = phy2log_row[r]
            share = shares[r] if shares is not None else 1.0 / counts[e]
            total += w[e] * share
        loads.append(total)
    return loads


def _gpu_choices(E: int, S: int, G: int, distinct: bool):
    combos = list(itertools.combinations(range(E), S) if distinct
                  else itertools.combinations_with_replacement(range(E), S))
    return itertools.product(combos, repeat=G)


def brute_force_max_load(w, G: int, S: int, split: str = "even", distinct: bool = True) -> float:
    """Best max GPU load (tokens) over every placement of ``S`` replicas on each of ``G`` GPUs
    with every expert placed at least once, by enumeration.

    even: a replica of an expert with ``c`` replicas computes ``w / c``. optimal: the best
    real-valued token split for the placement, ``max over expert sets A of w(A) / |GPUs
    holding some expert of A|`` (supply-demand theorem, Gale 1957), cross-checked against an
    HiGHS LP in tests/test_experts_bounds.py. ``distinct``: replicas of one expert on distinct
    GPUs (the product's rule); False allows co-location (EPLB's greedy does it).
    """
    w = np.asarray(w, dtype=np.float64)
    E = len(w)
    subsets = [A for r in range(1, E + 1) for A in itertools.combinations(range(E), r)]
    best = float("inf")
    for choice in _gpu_choices(E, S, G, distinct):
        cnt = np.zeros(E)
        for c in choice:
            for e in c:
                cnt[e] += 1
        if (cnt == 0).any():
            continue
        if split == "even":
            mx = max(sum(w[e] / cnt[e] for e in c) for c in choice)
        else:
            holders = [{g for g, c in enumerate(choice) if e in c} for e in range(E)]
            mx = max(sum(w[e] for e in A) / len(set().union(*(holders[e] for e in A))) for A in subsets)
        best = min(best, mx)
    return best


def optimal_split_lp(w, X) -> float:
    """Best max GPU load of placement ``X [experts, gpus]`` (0/1) with real-valued shares, by
    an LP solved with HiGHS (highspy): min T s.t. sum_g s[e,g] = w[e], 0 <= s[e,g] <= w[e] X[e,g],
    sum_e s[e,g] <= T."""
    import highspy

    from optimizer.highs import new_highs

    w = np.asarray(w, dtype=np.float64)
    E, G = X.shape
    h = new_highs()
    inf = highspy.kHighsInf
    s = {(e, g): h.addVariable(lb=0.0, ub=float(w[e] * X[e, g])) for e in range(E) for g in range(G)}
    T = h.addVariable(lb=0.0, ub=inf)
    for e in range(E):
        h.addConstr(sum(s[e, g] for g in range(G)) == float(w[e]))
    for g in range(G):
        h.addConstr(sum(s[e, g] for e in range(E)) - T <= 0.0)
    h.minimize(T)
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return float(h.getInfo().objective_function_value)


def distinct_per_gpu(phy2log_row, slots_per_gpu: int) -> bool:
    """Every GPU's replicas (``slots_per_gpu`` consecutive entries) hold distinct experts."""
    row = list(phy2log_row)
    return all(len(set(row[g:g + slots_per_gpu])) == slots_per_gpu for g in range(0, len(row), slots_per_gpu))


v3_loads = lognormal_loads  # the DeepSeek-V3-shaped default draws
