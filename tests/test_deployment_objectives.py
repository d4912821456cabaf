"""The money and fewest-GPU objectives, objective definitions in the output, and the result
envelope of the deployment problem."""
from __future__ import annotations

import json

import pytest

from optimizer.deployment import load, solve
from optimizer.result import Status
from tests.conftest import INSTANCES, assert_one_line_error

BOOK = INSTANCES / "qwen32b_128k.yaml"


@pytest.mark.parametrize("objective", ["gpus", "dollars"])
def test_adding_servers_never_looks_worse(objective):
    """Only GPUs in instances are billed/counted, so a second server cannot make the optimum worse
    (with `cost`, which bills every GPU of every server, it can)."""
    one = solve(load(BOOK), objective)
    two = solve(load(BOOK, ["hardware.servers=2"]), objective)
    assert one.status == two.status == Status.OPTIMAL
    assert two.outcome.value <= one.outcome.value * (1 + 1e-9)


def test_gpus_objective_is_fewest_gpus_meeting_every_requirement():
    r = solve(load(BOOK), "gpus")
    d = r.to_dict()
    assert r.status == Status.OPTIMAL
    used = sum(i["tp"] for i in d["plan"]["instances"])
    assert d["objective"]["value"] == used == d["plan"]["gpus_in_instances"]
    assert d["plan"]["on_time"] >= d["plan"]["required_on_time"]
    # exactness against brute force: tests/test_deployment_bruteforce.py (gpus and dollars included)


def test_dollars_recomputed_by_hand_from_the_plan():
    r = solve(load(BOOK), "dollars")
    d = r.to_dict()
    price = d["plan"]["dollars_per_gpu_hour"]
    assert price == pytest.approx(4.916)
    finish = {}
    for s in d["plan"]["sessions"]:
        finish[s["instance"]] = max(finish.get(s["instance"], 0.0), s["finish_ms"])
    billed_gpu_h = sum(i["tp"] * finish[i["id"]] for i in d["plan"]["instances"]) / 1e3 / 3600
    on = sum(s["on_time"] for s in d["plan"]["sessions"])
    assert d["objective"]["value"] == pytest.approx(price * billed_gpu_h / on, rel=1e-9)
    assert d["plan"]["dollars_per_hour"] == pytest.approx(price * d["plan"]["gpus_in_instances"])
    assert d["objective"]["unit"] == "$ per on-time session"


def test_dollars_without_a_price_is_one_line(cli):
    r = cli(BOOK, "--objective", "dollars", "--set", "hardware.gpu=b200", "--set", "hardware.server=dgx-b200")
    assert_one_line_error(r, "dollars_per_gpu_hour", "b200")


def test_price_override_in_the_instance():
    base = solve(load(BOOK), "dollars").outcome.value
    cheap = solve(load(BOOK, ["hardware.dollars_per_gpu_hour=2.458"]), "dollars").outcome.value
    assert cheap == pytest.approx(base / 2, rel=1e-9)


@pytest.mark.parametrize("objective", ["cost", "dollars", "gpus", "makespan", "latency", "energy"])
def test_every_figure_has_a_definition(objective, cli):
    r = cli(BOOK, "--objective", objective, "--format", "json")
    d = json.loads(r.stdout)
    assert d["objective"]["definition"] and d["objective"]["unit"]
    defs = d["definitions"]
    assert any(k.startswith("objective") and objective in k for k in defs)
    for figure in ("plan.makespan_ms", "plan.gpus_in_instances", "solver.time_s", "objective.bound", "objective.gap"):
        assert figure in defs and defs[figure]
    for key in d["plan"]:
        assert f"plan.{key}" in defs or any(k.startswith(f"plan.{key}") for k in defs) or key in (
            "instances", "sessions", "servers", "gpus_per_server", "on_time", "required_on_time",
            "dollars_per_gpu_hour", "worst_scenario", "servers_in_use"), key
    table = cli(BOOK, "--objective", objective)
    assert f"{objective} = " in table.stdout.splitlines()[-2] + table.stdout.splitlines()[-1]


def test_catalog_server_and_gpu_must_match(cli):
    """A DGX A100 holds A100s: pairing it with an H100 is bad input, named in one line."""
    assert_one_line_error(cli(BOOK, "--set", "hardware.server=dgx-a100"), "hardware.server", "dgx-a100",
                          "a100-sxm-80gb", "h100-sxm")
