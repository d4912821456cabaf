"""Helpers for the experts tests: write instances and traces, run the CLI, an independent evaluator."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml
from click.testing import CliRunner

from optimizer.cli import main

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
    code, out = run_cli(*args, "--format", "json")
    return code, json.loads(out)


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
