"""The KV-memory bound (``optimizer.deployment.params.kv_gpus_needed``): every session holds its
KV for the whole run and every replica its weights, so the sessions need at least
``Σ kv_token·(context+new) / (M − reserve − W/g_max)`` GPUs. Checked against the plans the
solver finds (the bound never exceeds the GPUs a plan uses) and on the case that made it
(2,000 long-context sessions on 32 servers: "time limit, no plan" at 3.5 s of a 10 s limit,
now infeasible with the memory conflict)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from optimizer.deployment.generate import generate_mixed
from tests.conftest import REPO as ROOT


@pytest.mark.parametrize("seed", range(3))
def test_the_bound_never_exceeds_the_gpus_of_a_plan(seed, tmp_path):
    from optimizer.deployment.api import load
    from optimizer.deployment.params import kv_gpus_needed
    from optimizer.deployment.perf import PerfModel
    from optimizer.deployment.strategy import solve_deployment

    raw = generate_mixed(40, 1, seed=seed, fraction=0.5, max_batch=None)
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(raw))
    problem = load(path)
    out = solve_deployment(problem, "cost", time_limit_s=3)
    bound = kv_gpus_needed(problem, PerfModel(problem))
    assert bound is not None and bound > 0
    if out.evaluation is not None and not out.evaluation.violations:
        used = sum(len(inst.gpus) for inst in out.evaluation.plan.instances)
        assert bound <= used + 1e-9, (bound, used)
    else:
        assert out.status.value in ("infeasible", "time_limit")


def test_two_thousand_long_sessions_on_32_servers_are_infeasible_by_memory(tmp_path):
    path = tmp_path / "m2000.yaml"
    path.write_text(yaml.safe_dump(generate_mixed(2000, 32, seed=0, max_batch=None)))
    res = subprocess.run([sys.executable, "-m", "optimizer.cli", str(path), "--time-limit", "10", "--format", "json"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr[-2000:]
    d = json.loads(res.stdout)
    assert d["status"] == "infeasible"
    assert any(c["family"] == "memory" for c in d["conflicts"])
    assert "KV caches" in d["achievable"]["detail"]
