"""Helpers for the build-out tests: instance dicts, in-process CLI, solving."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from optimizer.budget import Budget
from optimizer.buildout import PIPELINE
from optimizer.cli import main
from optimizer.problems import run_pipeline
from tests.conftest import with_changes

REPO = Path(__file__).resolve().parents[1]
INSTANCES = REPO / "instances"
EXAMPLE = INSTANCES / "hgx_h100_120kw.yaml"
SECOND_TIER = INSTANCES / "hgx_h100_120kw_second_tier.yaml"
UNITS4 = INSTANCES / "hgx_h100_120kw_units4.yaml"
MIXED = INSTANCES / "mixed_hall_1mw.yaml"


def raw_of(path: Path = EXAMPLE, **changes) -> dict:
    """The instance mapping with ``a__b=value`` changes applied (``buildout__power_budget_kw=100``)."""
    return with_changes(copy.deepcopy(yaml.safe_load(path.read_text())), **changes)


def report_of(raw: dict, objective: str | None = None, path: str | Path = "test.yaml", budget: Budget | None = None):
    """The build-out report of ``raw`` through the pipeline (without a budget: no time limit)."""
    return run_pipeline(PIPELINE, raw, Path(path), objective, budget or Budget.unlimited())


def run_cli(*args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``optimize ARGS`` run in-process."""
    r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def run_json(*args) -> tuple[int, dict]:
    code, out, _err = run_cli(*args, "--format", "json")
    return code, json.loads(out)


def write_instance(tmp_path: Path, raw: dict, name: str = "inst.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


def conflict_constraints(d: dict) -> set[str]:
    """Every constraint named in the envelope's grouped ``conflicts``."""
    return {c for g in d["conflicts"] for c in g["constraints"]}


def conflict_texts(d: dict) -> list[str]:
    """The detail sentence of each conflict group."""
    return [g["detail"] for g in d["conflicts"]]


def hall_cases() -> list[tuple[str, dict]]:
    """Hall sizes from 120 kW to 50 MW (the cases ``benchmarks/bench_buildout.py`` times, kept
    here so that tests do not import benchmark code): (label, raw instance)."""
    import copy

    import yaml

    fabric = {"switch_radix": 64, "port_bandwidth_gb_s": 50, "gpu_links": 1, "max_oversubscription": 3.0,
              "second_tier_power_kw": 25, "one_tier_max_gpus": 64}
    all4 = [{"name": "hgx-h100"}, {"name": "hgx-h200"}, {"name": "dgx-b200"}, {"name": "dgx-a100", "max_count": 64}]
    base = yaml.safe_load((REPO / "instances" / "hgx_h100_120kw.yaml").read_text())

    def mk(budget_kw, types, unit, with_fabric, target, fixed=0.0):
        raw = copy.deepcopy(base)
        b = raw["buildout"]
        b.update(power_budget_kw=float(budget_kw), server_types=types, install_unit_servers=unit,
                 target_gpus=target, fixed_power_kw=fixed)
        if with_fabric:
            b["fabric"] = dict(fabric)
        return raw

    return [
        ("120 kW, 1 type", mk(120, [{"name": "hgx-h100"}], 1, False, 64)),
        ("1 MW, 3 types, fabric", mk(1000, all4[1:], 2, True, 512, 60)),
        ("10 MW, 4 types, fabric", mk(10_000, all4, 4, True, 5_000, 400)),
        ("50 MW, 4 types, fabric", mk(50_000, all4, 4, True, 25_000, 2_000)),
    ]
