"""Infeasible answers lead with the best achievable value, group repeated constraints, and name
the one rule that rules out every option (issue: answers a planner can act on)."""
from __future__ import annotations

import json

from tests.conftest import INSTANCES

BOOK = INSTANCES / "qwen32b_128k.yaml"
EIGHT = ["--set", "workload.sessions=[{name: chat, count: 8, context_tokens: 8192, new_tokens: 256, deadline_ms: 5000}]",
         "--set", "deployment.tensor_parallel=[1, 2, 4, 8]", "--set", "workload.min_on_time_fraction=1",
         "--set", "deployment.max_batch=1"]


def _json(cli, *args):
    r = cli(BOOK, *args, "--format", "json")
    return r.exit_code, json.loads(r.stdout)


def test_eight_sessions_one_at_a_time_say_six_of_eight(cli):
    """One session at a time per instance: the best plan has 6 of 8 on time, and the answer says so."""
    code, d = _json(cli, *EIGHT)
    assert code == 3
    assert d["achievable"] == {"requirement": "on_time", "best": 6, "required": 8,
                               "detail": "at most 6 of 8 sessions can finish on time; 8 required"}
    table = cli(BOOK, *EIGHT).stdout
    lines = table.splitlines()
    assert lines[2].startswith("infeasible") and lines[3].startswith("best achievable: at most 6 of 8")


def test_one_ms_deadline_groups_repeated_constraints(cli):
    code, d = _json(cli, "--set", "workload.sessions.0.deadline_ms=1")
    assert code == 3
    groups = {g["family"]: g for g in d["conflicts"]}
    assert groups["deadline"]["count"] > 1 and groups["deadline"]["count"] == len(groups["deadline"]["constraints"])
    table = cli(BOOK, "--set", "workload.sessions.0.deadline_ms=1").stdout
    conflict_lines = [l for l in table.splitlines() if l.startswith("  - deadline")]
    assert len(conflict_lines) == 1 and f"x{groups['deadline']['count']}" in conflict_lines[0]
    assert d["achievable"]["best"] == 0


def test_one_rule_for_every_option_is_named(cli):
    """TP16 alone on one 8-GPU server: the gpus rule, not an empty conflict list. (A degree that
    cannot split the heads, TP3 here before, is bad input now, exit 2: see
    tests/test_deployment_fresh_user.py.)"""
    code, d = _json(cli, "--set", "deployment.tensor_parallel=[16]")
    assert code == 3
    assert d["conflicts"] == [{"family": "gpus", "count": 1, "constraints": ["gpus[tp16]"],
                               "detail": "tp16 needs 16 GPUs > 8 available"}]
    assert d["achievable"]["requirement"] == "gpus"
    table = cli(BOOK, "--set", "deployment.tensor_parallel=[16]").stdout
    assert "ruled out by the gpus rule" in table and "gpus[tp16]" in table
