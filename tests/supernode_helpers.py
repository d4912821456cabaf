"""Helpers for the supernode tests: a small synthetic inventory, instance dicts, CLI runs."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from optimizer.budget import Budget
from optimizer.cli import main

REPO = Path(__file__).resolve().parents[1]
CHAPTER = REPO / "instances" / "supernode_v41_flash.yaml"

# A small MoE model (figures chosen for hand checks, not a real checkpoint).
SMALL_INVENTORY = {
    "model": "synthetic/small-moe",
    "layers": 4,
    "hidden_size": 1024,
    "experts": {"routed": 16, "per_token": 2, "expert_bytes": 100_000_000, "routed_bytes": 6_400_000_000},
    "weights": {"replicated_read_bytes": 2_000_000_000, "replicated_resident_bytes": 2_500_000_000},
    "engram": {"layers": [1], "rows": [10_000_000], "row_bytes": 500, "rows_per_token": 8,
               "projection_bytes": 100_000_000},
    "kv": {"capacity_bytes": {"fixed": 1_000_000, "per_context_token": 1000},
           "read_bytes_per_step": {"fixed": 1_000_000, "per_context_token": 500}},
    "flops_per_token": {"fixed": 4_000_000_000, "per_context_token": 1000},
    "dispatch_bytes_per_token": 4096,
}

SMALL_SYSTEM = {
    "card": {"name": "toy", "memory_gb": 24, "memory_bandwidth_gb_s": 1000, "bf16_tflops": 100},
    "server_cards": 4,
    "max_scale_up_cards": 8,
    "scale_up": {"bandwidth_gb_s": 100, "latency_us": 1.0},
    "scale_out": {"bandwidth_gb_s": 10, "latency_us": 5.0},
    "tiers": {
        "host": {"capacity_gb_per_server": 8, "round_trip_us": 2.0, "bandwidth_gb_s": 32, "random_reads_per_s": 1e8},
        "pool": {"capacity_gb": 12, "round_trip_us": 5.0, "transaction_bytes": 256, "in_flight": 64,
                 "path_bandwidth_gb_s": 10},
        "rom": {"capacity_gb_per_card": 1.5, "latency_per_hop_us": 1.0, "hops": 2, "bandwidth_gb_s": 50},
    },
}


def small_instance(tmp_path: Path, inventory: dict | None = None, **supernode) -> Path:
    """Write the synthetic inventory and an instance using it; returns the instance path."""
    inv = tmp_path / "small.inventory.yaml"
    inv.write_text(yaml.safe_dump(inventory if inventory is not None else SMALL_INVENTORY, sort_keys=False))
    sn = {"system": copy.deepcopy(SMALL_SYSTEM), "cards": 16, "sizes": [4, 8, 16], "allow_cross_server": True,
          "context_tokens": 4000, "reserve_gib_per_card": 1, "slo_ms_per_token": 50, "overlap_efficiency": 0.9,
          "fixed_us_per_token": 0, "table_tiers": ["hbm", "host", "pool", "rom"], "kv_tiers": ["hbm"],
          "target_sessions": None}
    sn.update(supernode)
    raw = {"name": "small", "model": {"inventory": inv.name}, "supernode": sn}
    path = tmp_path / "inst.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_cli(*args) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def run_json(*args) -> tuple[int, dict]:
    code, out, _err = run_cli(*args, "--format", "json")
    return code, json.loads(out)


def with_objective(p, objective: str):
    """The resolved problem ``p`` with the named objective object."""
    import dataclasses

    from objectives.supernode import registry

    return dataclasses.replace(p, objective=registry()[objective])


def report_for(p, objective: str | None = None, thresholds: bool = True, budget: Budget | None = None):
    """The supernode report of the resolved problem ``p`` (with ``objective``: that objective)
    through the pipeline's solve, explain and report (without a budget: no time limit)."""
    from optimizer.supernode import SupernodePipeline

    if objective is not None:
        p = with_objective(p, objective)
    pipeline = SupernodePipeline(thresholds=thresholds)
    budget = budget or Budget.unlimited()
    solution = pipeline.solve(p, budget)
    return pipeline.report(p, solution, pipeline.explain(p, solution, budget))


def solve_for(p, objective: str | None = None, results=None):
    """The frozen solution of ``p`` (with ``objective``: that objective), no time limit."""
    from optimizer.supernode.solve import solve

    return solve(p if objective is None else with_objective(p, objective), Budget.unlimited(), results=results)
