"""The shipped deployment instances beyond the book one: each solves through the CLI and the
Python API, the plan passes the independent evaluator under every objective, and the small
ones (or reduced copies of the larger ones) equal brute force."""
from __future__ import annotations

import json

import pytest

from optimizer.deployment import load, solve
from optimizer.model.collectives import ring_allreduce_s
from optimizer.deployment.perf import PerfModel
from tests.conftest import INSTANCES
from tests.deploy_helpers import brute_force_all

NEW = ["qwen32b_128k_fault.yaml", "llama8b_mixed_h200.yaml", "qwen32b_two_servers.yaml", "inline_hardware.yaml"]
OBJECTIVES = ["cost", "makespan", "latency", "energy"]


@pytest.mark.parametrize("name", NEW)
def test_instance_file_names_its_sources(name):
    text = (INSTANCES / name).read_text()
    assert text.startswith("#")
    assert "Sources:" in text


@pytest.mark.parametrize("name", NEW)
def test_cli_json(cli, name):
    r = cli(INSTANCES / name, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["status"] == "optimal"
    assert d["objective"]["name"] == "cost"
    assert d["objective"]["bound"] == pytest.approx(d["objective"]["value"], rel=1e-5)  # gap closed
    assert d["plan"]["on_time"] >= d["plan"]["required_on_time"]
    served = sorted(s for i in d["plan"]["instances"] for s in i["sessions"])
    assert served == sorted(s["id"] for s in d["plan"]["sessions"])


# latency on the full two-server instance uses the sequence formulation and takes 12-27 s to
# prove optimal on 2 cores (cost: under 1 s); its reduced copy is checked against brute force below
SWEEP = [(n, o) for n in NEW for o in OBJECTIVES if (n, o) != ("qwen32b_two_servers.yaml", "latency")]


@pytest.mark.parametrize("name,objective", SWEEP)
def test_solver_plan_passes_evaluator(name, objective):
    problem = load(INSTANCES / name)
    r = solve(problem, objective, explain=False)
    assert r.status.value == "optimal"
    ev = r.outcome.evaluation
    assert ev.violations == []
    assert ev.objective_value(objective) == pytest.approx(r.outcome.value, rel=1e-9)
    # every instance's GPUs hold its weights and the KV of all its sessions
    assert max(ev.memory_per_gpu.values()) <= problem.gpu.memory_bytes


@pytest.mark.parametrize("name", NEW)
def test_plan_no_worse_than_any_single_degree(name):
    """The chosen plan may mix degrees; it can never lose to the best plan of one degree."""
    r = solve(load(INSTANCES / name), "cost")
    values = [a.value for a in r.alternatives if a.value is not None]
    assert values, "at least one degree alone has a plan"
    assert r.outcome.value <= min(values) * (1 + 1e-9)


# ----------------------------------------------------------------------------- per instance


def test_fault_instance_acceptance_values():
    """Issue #2: with faults [{at_ms: 20, stall_ms: 40}] -> four TP2, 0.478 GPU·s per on-time session."""
    problem = load(INSTANCES / "qwen32b_128k_fault.yaml")
    r = solve(problem, "cost")
    ev = r.outcome.evaluation
    assert round(r.outcome.value, 3) == 0.478
    assert [i.degree for i in ev.plan.instances] == [2, 2, 2, 2]
    assert len(ev.scenarios) == 8  # no gpu given: every GPU of the server may fail
    assert r.outcome.value == pytest.approx(max(s.cost_gpu_s for s in ev.scenarios), rel=1e-12)
    # the worst case: the failed instance restarts its session at 60 ms and misses 130 ms
    perf = PerfModel(problem)
    svc = perf.service_time_s(2, 131064, 8)
    assert max(s.makespan_s for s in ev.scenarios) == pytest.approx(0.060 + svc, rel=1e-12)
    assert min(s.on_time for s in ev.scenarios) == 3


def test_two_servers_tp16_uses_scale_out():
    problem = load(INSTANCES / "qwen32b_two_servers.yaml")
    perf = PerfModel(problem)
    assert problem.total_gpus == 16 and 16 in problem.degrees
    assert perf.spans_servers(16) and not perf.spans_servers(8)
    assert perf.allreduce_s(16) == pytest.approx(ring_allreduce_s(16, 5120 * 2, 3.76e-6, 50e9), rel=1e-12)
    assert perf.allreduce_s(8) == pytest.approx(ring_allreduce_s(8, 5120 * 2, 0.822e-6, 450e9), rel=1e-12)
    # TP16 pays ~14.5 ms of AllReduce per step: a 128K session alone misses its 130 ms
    longctx = next(c for c in problem.classes if c.context == 131064)
    assert perf.service_time_s(16, longctx.context, longctx.new) > longctx.deadline_s
    r = solve(problem, "cost")
    tp16 = next(a for a in r.alternatives if a.degree == 16)
    assert tp16.reason == "deadline"
    assert all(len(i.servers) == 1 for i in r.outcome.evaluation.plan.instances)


def test_inline_hardware_is_resolved_in_si_units():
    problem = load(INSTANCES / "inline_hardware.yaml")
    assert problem.gpu.name == "a100-pcie-80gb"
    assert problem.gpu.memory_bytes == 80e9
    assert problem.gpu.hbm_bytes_per_s == 1935e9
    assert problem.gpu.peak_flops == 312e12
    assert problem.server.gpus == 4 and problem.server.power_w == 2000.0
    assert problem.server.scale_up.bandwidth_bytes_per_s == 32e9
    assert problem.server.scale_up.alpha_s == pytest.approx(2.0e-6)
    assert problem.degrees == (1, 2, 4)


def test_inline_hardware_tp1_rejected_by_memory_of_the_document_session():
    problem = load(INSTANCES / "inline_hardware.yaml")
    perf = PerfModel(problem)
    doc = next(c for c in problem.classes if c.context == 65536)
    need = perf.memory_per_gpu(1, [(doc.context, doc.new)])
    assert need > problem.gpu.memory_bytes
    r = solve(problem, "cost")
    tp1 = next(a for a in r.alternatives if a.degree == 1)
    assert tp1.reason == "memory"
    assert f"doc/0 ({doc.context + doc.new} tokens) needs {need / 1e9:.2f} GB per GPU > 80 GB" == tp1.detail


def test_llama8b_mixed_memory_never_binds_and_batch_has_no_deadline():
    problem = load(INSTANCES / "llama8b_mixed_h200.yaml")
    perf = PerfModel(problem)
    # every session at once on one TP1 GPU still fits 141 GB
    assert perf.memory_per_gpu(1, [(s.context, s.new) for s in problem.sessions]) < problem.gpu.memory_bytes
    assert [s.deadline_s for s in problem.sessions if s.group == "batch"] == [None]
    r = solve(problem, "cost")
    ev = r.outcome.evaluation
    assert next(t for t in ev.nominal.sessions if t.id == "batch/0").on_time
    assert ev.nominal.on_time >= problem.required_on_time == 7


# ----------------------------------------------------------------------------- brute force


BRUTE = [
    ("inline_hardware.yaml", ()),
    ("qwen32b_128k_fault.yaml", ()),
    # the two larger instances, reduced to 5 sessions (one or two of each class)
    ("llama8b_mixed_h200.yaml", ("workload.sessions.0.count=2", "workload.sessions.1.count=1")),
    ("qwen32b_two_servers.yaml", ("workload.sessions.0.count=1", "workload.sessions.1.count=1",
                                  "workload.sessions.2.count=2")),
]


@pytest.mark.parametrize("name,sets", BRUTE)
def test_equals_brute_force(name, sets):
    """Every objective's optimum against one exhaustive enumeration of the instance's plans."""
    problem = load(INSTANCES / name, sets)
    assert len(problem.sessions) <= 5
    optimum = brute_force_all(problem, OBJECTIVES)
    for objective in OBJECTIVES:
        r = solve(problem, objective, explain=False)
        best = optimum[objective]
        assert best is not None, objective
        assert r.outcome.value == pytest.approx(best, rel=1e-9), objective
