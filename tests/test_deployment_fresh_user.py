"""Faults found by a fresh-user pass over the deployment problem: infeasibility that does not
depend on the objective, the GPU count as a binding limit, HF config fields that are absent,
a time limit that has passed before the solve, and TP degrees that cannot split the heads.
Every instance is written into ``tmp_path`` and uses ``instances/models/qwen3-32b.json``."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import INSTANCES, assert_one_line_error

QWEN32B = INSTANCES / "models" / "qwen3-32b.json"


def _instance(tmp_path, sessions, degrees=(4,), servers=1, fraction=1.0, name="inst.yaml", config=QWEN32B,
              deployment=None):
    raw = {
        "name": "fresh-user case",
        "model": {"config": str(config), "weight_dtype": "bf16", "kv_dtype": "bf16",
                  "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}},
        "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": servers},
        "workload": {"sessions": sessions, "min_on_time_fraction": fraction},
        "deployment": deployment or {"reserve_gib_per_gpu": 2, "tensor_parallel": list(degrees),
                                     "allreduce": "ring", "max_batch": 1},
        "faults": [],
    }
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw))
    return p


def _json(cli, *args):
    r = cli(*args, "--format", "json")
    return r.exit_code, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else None), r


# 1. ------------------------------------------------------------------------------------------
MIXED = [
    {"name": "a", "count": 9, "context_tokens": 32768, "new_tokens": 8, "deadline_ms": 120},
    {"name": "b", "count": 9, "context_tokens": 8192, "new_tokens": 16, "deadline_ms": 150},
    {"name": "c", "count": 9, "context_tokens": 65536, "new_tokens": 8, "deadline_ms": 200},
]


def test_latency_proves_infeasibility_as_makespan_does(cli, tmp_path):
    """27 sessions on 2 servers, all on time: at most 16 can be. Latency (sequence model) used
    to spend its whole limit and exit 4; whether a plan exists does not depend on the
    objective, so it exits 3 from the aggregate check with the same conflicting families."""
    p = _instance(tmp_path, MIXED, degrees=(1, 2, 4, 8), servers=2)
    out = {}
    for obj in ("makespan", "latency"):
        code, d, r = _json(cli, p, "--objective", obj, "--time-limit", "6")
        assert code == 3, r.output
        assert d["status"] == "infeasible"
        out[obj] = d
    lat = out["latency"]
    assert lat["solver"]["formulation"] == "aggregate (feasibility)"
    fams = lambda d: {g["family"] for g in d["conflicts"]}  # noqa: E731
    assert fams(lat) == fams(out["makespan"]) and {"deadline", "on_time", "gpus_per_server"} <= fams(lat)
    assert lat["achievable"] == out["makespan"]["achievable"]
    assert lat["achievable"]["best"] == 16 and lat["achievable"]["required"] == 27


def test_latency_still_solves_a_feasible_instance(cli, tmp_path):
    """The feasibility check only stops proven-infeasible instances."""
    sessions = [dict(MIXED[0], deadline_ms=400, count=3), dict(MIXED[1], deadline_ms=400, count=3)]
    code, d, r = _json(cli, _instance(tmp_path, sessions, degrees=(2, 4)), "--objective", "latency")
    assert code == 0, r.output
    assert d["plan"]["on_time"] == 6


# 2. ------------------------------------------------------------------------------------------
BOOK_SESSIONS = [{"name": "chat", "count": 4, "context_tokens": 131064, "new_tokens": 8, "deadline_ms": 100}]


def test_gpu_count_is_named_when_more_servers_would_fit(cli, tmp_path):
    """TP4 only on 8 GPUs holds 2 instances, each runs one 128K session by 100 ms: 2 of 4 on
    time. The GPU count binds; two servers (4 TP4 instances) meet every limit."""
    p = _instance(tmp_path, BOOK_SESSIONS)
    code, d, r = _json(cli, p)
    assert code == 3, r.output
    g = next(g for g in d["conflicts"] if g["family"] == "gpus_per_server")
    assert "1 server x 8 GPUs = 8 GPUs hold at most 2 TP4 instances" in g["detail"]
    assert "with 2 servers (16 GPUs) a plan meets every limit" in g["detail"]
    # the relaxation it states holds: two servers solve it
    code2, d2, r2 = _json(cli, p, "--set", "hardware.servers=2")
    assert code2 == 0, r2.output
    assert d2["plan"]["on_time"] == 4
    table = cli(p).stdout
    assert "gpus_per_server[all servers]" in table and "with 2 servers (16 GPUs)" in table


def test_gpu_count_smallest_server_count(cli, tmp_path):
    """Ten sessions that each need their own TP4 instance to be on time: 5 servers, not 2."""
    p = _instance(tmp_path, [dict(BOOK_SESSIONS[0], count=10)])
    code, d, r = _json(cli, p)
    assert code == 3, r.output
    g = next(g for g in d["conflicts"] if g["family"] == "gpus_per_server")
    assert "with 5 servers (40 GPUs)" in g["detail"]
    assert _json(cli, p, "--set", "hardware.servers=4")[0] == 3
    assert _json(cli, p, "--set", "hardware.servers=5")[0] == 0


def test_gpu_count_not_named_when_servers_do_not_help(cli, tmp_path):
    """A 30 ms deadline that a session misses even alone: no server count helps."""
    p = _instance(tmp_path, [dict(BOOK_SESSIONS[0], deadline_ms=30)], degrees=(2, 4, 8), fraction=0.75)
    code, d, r = _json(cli, p)
    assert code == 3, r.output
    assert "gpus_per_server" not in {g["family"] for g in d["conflicts"]}
    assert "a plan meets every limit" not in r.stdout
