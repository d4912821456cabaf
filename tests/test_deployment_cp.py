"""Context parallelism in the deployment problem (issue #26 item 4): decode of sessions already in
the KV cache on ``cp`` copies of the attention TP group, each holding 1/cp of every session's KV.

Golden case: 24 Qwen3-32B sessions at the model's largest YaRN context (131,064 + 8 = 131,072
tokens) do not fit TP8 on one HGX H100 and fit TP8xCP2 on two; the memory per GPU and the step
time are checked term by term against the shared model."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from optimizer.deployment.api import load, solve
from optimizer.deployment.perf import PerfModel
from optimizer.model.layout import Layout
from optimizer.model.perf import batch_step_table
from optimizer.model.sequence import cp_decode_merge_s
from optimizer.result import Status
from tests.conftest import INSTANCES, assert_one_line_error

GIB = 2 ** 30
CTX, NEW, COUNT = 131_064, 8, 24


def _instance(tmp_path, layouts, servers):
    raw = yaml.safe_load((INSTANCES / "qwen32b_128k.yaml").read_text())
    raw["model"]["config"] = str(INSTANCES / "models" / "qwen3-32b.json")
    raw["hardware"]["servers"] = servers
    raw["workload"]["sessions"][0].update(count=COUNT, deadline_ms=1000)
    raw["workload"]["min_on_time_fraction"] = 1.0
    raw["deployment"] = {"reserve_gib_per_gpu": 2, "layouts": layouts}
    p = tmp_path / "cp.yaml"
    p.write_text(yaml.safe_dump(raw))
    return load(p)


def test_qwen3_32b_131k_sessions_fit_tp8_cp2_on_two_servers_not_tp8_on_one(tmp_path):
    problem = _instance(tmp_path, [{"attention": {"tp": 8}, "cp": 2}], 2)
    cp2 = problem.layouts[0]
    assert cp2 == Layout(8, 1, 8, 1, 1, 2) and cp2.label() == "TP8xCP2" and cp2.gpus == 16
    m = PerfModel(problem).model
    tp8 = Layout.tp(8)
    # memory per GPU: the weights of the TP8 group (9.63 GiB with the 2 GiB reserve), KV halved
    assert m.static_bytes_per_gpu(cp2) == m.static_bytes_per_gpu(tp8) == pytest.approx(9.629129 * GIB, rel=1e-6)
    kv_tp8 = 64 * 2 * 8 * 128 * 2 * (CTX + NEW) / 8  # 64 layers, K and V, 8 KV heads x 128, BF16, over TP8
    assert m.kv_bytes_per_gpu(tp8, CTX, NEW) == kv_tp8 == 4 * GIB
    assert m.kv_bytes_per_gpu(cp2, CTX, NEW) == kv_tp8 / 2 == 2 * GIB
    sessions = [(CTX, NEW)] * COUNT
    assert m.memory_per_gpu(tp8, sessions) == pytest.approx(m.static_bytes_per_gpu(tp8) + COUNT * 4 * GIB)  # 105.6 GiB
    assert m.memory_per_gpu(cp2, sessions) == pytest.approx(m.static_bytes_per_gpu(tp8) + COUNT * 2 * GIB)  # 57.6 GiB
    assert m.memory_per_gpu(tp8, sessions) > m.hw.gpu.memory_bytes > m.memory_per_gpu(cp2, sessions)
    assert (m.max_sessions(tp8, CTX, NEW), m.max_sessions(cp2, CTX, NEW)) == (16, 32)

    # decode step of all 24 at position 131,064: GEMMs as TP8, attention over half the KV, plus the merge
    pos = np.full(COUNT, CTX)
    a, b = m.step(tp8, pos), m.step(cp2, pos)
    hbm = m.hw.gpu.hbm_bytes_per_s
    assert b.weight_bytes_read == a.weight_bytes_read  # every rank reads the TP8 group's weights
    assert b.kv_bytes_read == a.kv_bytes_read / 2 == COUNT * (CTX + 1) * 64 * 2 * 8 * 128 * 2 / 8 / 2
    assert b.allreduce_s == a.allreduce_s  # the projections' and FFN's AllReduces of the TP8 group
    attn_flops = 4 * 64 * 128 * 64 * COUNT * (CTX + 1) / 8  # 4·QH·D per context token per layer, over TP8
    assert a.flops - b.flops == pytest.approx(attn_flops / 2, rel=1e-12)
    out = m.hw.server.scale_out  # 16 GPUs span two servers: the merge runs over scale-out
    merge = 64 * cp_decode_merge_s(2, 8, COUNT, 64, 128, out.alpha_s, out.bandwidth_bytes_per_s)
    assert merge == pytest.approx(64 * (out.alpha_s + COUNT * 8 * 130 * 4 / out.bandwidth_bytes_per_s))
    assert (a.alltoall_s, b.alltoall_s) == (0.0, pytest.approx(merge, rel=1e-12))
    assert b.local_s == pytest.approx((b.weight_bytes_read + b.kv_bytes_read) / hbm, rel=1e-12)
    assert b.local_s > b.compute_s  # memory bound: step = (weights + KV/2)/B_HBM + AllReduces + merge
    assert b.total_s == pytest.approx(b.local_s + b.allreduce_s + merge, rel=1e-12)
    assert (a.total_s, b.total_s) == (pytest.approx(34.750e-3, rel=1e-4), pytest.approx(19.735e-3, rel=1e-4))
    # the evaluator's vectorised step table equals the shared model step on CP layouts
    got = batch_step_table(m).step_times_s(cp2, pos[:5] - np.arange(5) * 1000, 3)
    want = [m.step_time_s(cp2, pos[:5] - np.arange(5) * 1000 + j) for j in range(3)]
    assert got == pytest.approx(want, rel=1e-10)
    assert float(m.single_session_step_s(cp2, [CTX])[0]) == pytest.approx(m.step_time_s(cp2, [CTX]), rel=1e-12)

    rep = solve(problem, "cost", time_limit_s=30, explain=False)
    assert rep.status == Status.OPTIMAL
    ev = rep.outcome.evaluation
    assert ev.violations == [] and ev.nominal.on_time == COUNT
    (inst,) = ev.plan.instances
    assert inst.layout == cp2 and inst.servers == (0, 1) and len(inst.gpus) == 16 and len(inst.sessions) == COUNT
    d = rep.to_dict()["plan"]["instances"][0]
    assert d["layout"]["cp"] == 2
    # TP8 on one server cannot hold them
    assert solve(_instance(tmp_path, [{"attention": {"tp": 8}}], 1), "cost", time_limit_s=30,
                 explain=False).status == Status.INFEASIBLE


def test_cp_within_one_server_merges_over_scale_up(tmp_path):
    problem = _instance(tmp_path, [{"attention": {"tp": 4}, "cp": 2}], 1)
    m = PerfModel(problem).model
    lay = problem.layouts[0]
    up = m.hw.server.scale_up
    want = 64 * cp_decode_merge_s(2, 4, 3, 64, 128, up.alpha_s, up.bandwidth_bytes_per_s)
    assert m.step(lay, [1000, 2000, 3000]).alltoall_s == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("cp,message", [("3", "power of two"), ("0", "positive integer"), ("-2", "positive integer"),
                                         ("true", "cp")])
def test_bad_cp_exits_2_naming_the_field(cli, cp, message):
    assert_one_line_error(cli(INSTANCES / "qwen32b_batched_8k.yaml", "--set",
                              f"deployment.layouts=[{{attention: {{tp: 4}}, cp: {cp}}}]"),
                          "deployment.layouts[0].cp", message)
