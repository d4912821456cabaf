"""The shared performance model (optimizer.model.perf) per layout and with batched decode.

Acceptance values of the issue (Qwen3-235B-A22B on one HGX H100, bf16, 2 GiB reserve,
8,192-token sessions) are checked to one unit in the last quoted digit; formula checks are
relative 1e-12; the |A| = 1 case must equal the deployment model exactly.
"""
from __future__ import annotations

import numpy as np
import pytest

from optimizer.deployment.perf import PerfModel as DeploymentPerf
from optimizer.model import Layout, PerfModel, expected_active_experts, hardware_from_catalog, read_hf_config
from optimizer.model.perf import pipeline_time, pipeline_utilisation, stage_layers
from tests.conftest import INSTANCES, shared
from tests.deploy_helpers import book_problem

GIB = 2 ** 30
CTX = 8192


@pytest.fixture(scope="module")
def hw():
    return hardware_from_catalog("h100-sxm", "hgx-h100")


@pytest.fixture(scope="module")
def qwen235(hw):
    return PerfModel(read_hf_config(shared("models", "Qwen--Qwen3-235B-A22B.config.json")), hw, 2.0, 2.0, 2 * GIB)


def test_qwen235_tp8_memory(qwen235):
    tp8 = Layout.tp(8)
    assert qwen235.weight_bytes_per_gpu(tp8) / 1e9 == pytest.approx(58.96, abs=0.005)
    assert qwen235.kv_bytes_per_gpu(tp8, CTX, 0) / 1e9 == pytest.approx(0.39, abs=0.005)
    assert qwen235.kv_shards(tp8) == 4  # 4 KV heads: each held twice
    assert qwen235.memory_per_gpu(tp8, [(CTX, 0)]) / 1e9 == pytest.approx(61.50, abs=0.005)
    assert qwen235.max_sessions(tp8, CTX, 0) == 47


def test_qwen235_decode_token_reads(qwen235):
    one = qwen235.step(Layout.tp(1), [CTX - 1])
    assert one.weight_bytes_read / 1e9 == pytest.approx(43.1, abs=0.05)
    assert one.kv_bytes_read / 1e9 == pytest.approx(1.58, abs=0.005)
    eight = qwen235.step(Layout.tp(8), [CTX - 1])
    assert (eight.weight_bytes_read + eight.kv_bytes_read) / 1e9 == pytest.approx(5.79, abs=0.005)
    assert eight.local_s * 1e3 == pytest.approx(1.73, abs=0.005)
    assert eight.compute_s < eight.local_s  # memory bound
    assert eight.active_experts_per_layer == pytest.approx(8)


def test_qwen235_tp2_ep4(qwen235):
    lay = qwen235.check(Layout(attention_tp=2, attention_dp=4, experts_tp=2, experts_ep=4))
    assert qwen235.weight_bytes_per_gpu(lay) / 1e9 == pytest.approx(64.8, abs=0.05)
    assert qwen235.weight_bytes_total(lay) / 1e9 == pytest.approx(518.6, abs=0.05)
    assert qwen235.kv_bytes_per_gpu(lay, CTX, 0) / 2 ** 20 == pytest.approx(752, abs=0.5)
    # the same experts split as EP8 (experts TP1) hold the same bytes
    assert qwen235.weight_bytes_per_gpu(Layout(2, 4, 1, 8)) == pytest.approx(qwen235.weight_bytes_per_gpu(lay), rel=1e-12)
    # DP attention: 4 ranks each hold their own sessions
    assert qwen235.max_sessions(lay, CTX, 0) % 4 == 0


def test_eq_6_8_active_experts():
    a = float(expected_active_experts(128, 8, 8))
    assert a == pytest.approx(52, abs=0.5)
    assert a * 36 * 2 ** 20 / GIB == pytest.approx(1.8, abs=0.05)
    assert float(expected_active_experts(128, 8, 1)) == 8
    assert expected_active_experts(128, 8, np.array([1, 1000])).tolist()[1] == pytest.approx(128, rel=1e-3)


def test_expert_bytes_qwen235(qwen235):
    assert qwen235.w.expert_bytes / 2 ** 20 == pytest.approx(36, abs=0.01)


def test_batch_grows_expert_reads(qwen235):
    tp8 = Layout.tp(8)
    s1 = qwen235.step(tp8, [CTX - 1])
    s8 = qwen235.step(tp8, [CTX - 1] * 8)
    assert s8.active_experts_per_layer == pytest.approx(float(expected_active_experts(128, 8, 8)))
    routed = 94 * (s8.active_experts_per_layer - 8) * qwen235.w.expert_bytes / 8
    kv = 7 * qwen235.w.kv_bytes_per_token * CTX / 4
    assert s8.weight_bytes_read + s8.kv_bytes_read - (s1.weight_bytes_read + s1.kv_bytes_read) == pytest.approx(routed + kv, rel=1e-12)


def test_busiest_ep_group_from_loads(qwen235):
    lay = Layout(1, 8, 1, 8)
    uniform = np.zeros(128)
    uniform[::16] = 1  # 8 experts, one per EP group (16 experts each)
    skewed = np.zeros(128)
    skewed[:8] = 1  # the same 8 experts all in group 0
    u = qwen235.step(lay, [CTX - 1], expert_loads=uniform)
    s = qwen235.step(lay, [CTX - 1], expert_loads=skewed)
    assert u.active_experts_per_layer == 1 and s.active_experts_per_layer == 8
    assert s.weight_bytes_read - u.weight_bytes_read == pytest.approx(94 * 7 * qwen235.w.expert_bytes, rel=1e-12)
    # per-layer loads: half the layers skewed
    per_layer = np.array([skewed if i % 2 else uniform for i in range(94)])
    h = qwen235.step(lay, [CTX - 1], expert_loads=per_layer)
    assert h.weight_bytes_read - u.weight_bytes_read == pytest.approx(47 * 7 * qwen235.w.expert_bytes, rel=1e-12)
    with pytest.raises(ValueError):
        qwen235.step(lay, [CTX - 1], expert_loads=np.zeros(100))


# ----------------------------------------------------------------------------- dense batched


@pytest.fixture(scope="module")
def book():
    return DeploymentPerf(book_problem())


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_single_session_equals_deployment_model(book, p):
    pos = [0, 4096, 131064, 131071]
    batched = [book.model.step_time_s(Layout.tp(p), [s]) for s in pos]
    assert batched == book.step_times_s(p, np.array(pos)).tolist()  # exactly


@pytest.mark.parametrize("p", [1, 2, 8, 16])
def test_dense_batched_formula(book, p):
    """``max(local, compute) + 2L·T_AR(p, |A|·H·2)`` with the issue's local and compute terms."""
    m, g, hw = book.m, book.problem.gpu, book.model.hw
    pos = np.array([100, 5000, 70000])
    w = book.w
    kvh = min(p, m.kv_heads)
    local = (w.read_per_step / p + sum(book.kv_token * (s + 1) / kvh for s in pos)) / g.hbm_bytes_per_s
    compute = (len(pos) * 2 * w.read_per_step / 2.0 + sum(4 * m.q_heads * m.head_dim * (s + 1) * m.layers for s in pos)) / p / g.peak_flops
    expected = max(local, compute) + 2 * m.layers * hw.allreduce_s(p, len(pos) * m.hidden * 2.0)
    assert book.batch_step_time_s(p, pos) == pytest.approx(expected, rel=1e-12)


def test_tp16_holds_a_whole_kv_head_projection(book):
    """TP16 > KVH = 8: each GPU keeps 1/8 of the K and V projections (eq. 6-1 with replication)."""
    m = book.m
    kv_proj = m.layers * 2 * m.hidden * m.kv_heads * m.head_dim * 2.0
    extra = kv_proj / 8 - kv_proj / 16
    plain = (book.w.resident - book.w.norms) / 16 + book.w.norms + book.problem.reserve_bytes
    assert book.static_bytes_per_gpu(16) == pytest.approx(plain + extra, rel=1e-12)
    assert book.static_bytes_per_gpu(8) == (book.w.resident - book.w.norms) / 8 + book.w.norms + book.problem.reserve_bytes


# ----------------------------------------------------------------------------- MLA, DP, PP


@pytest.fixture(scope="module")
def deepseek():
    """DeepSeek-V3 in FP8 (KV in bf16) on one HGX H200 (141 GB per GPU)."""
    h200 = hardware_from_catalog("h200-sxm", "hgx-h200")
    return PerfModel(read_hf_config(shared("models", "deepseek-ai--DeepSeek-V3.config.json")), h200, 1.0, 2.0, 2 * GIB)


def test_mla_latent_not_split_by_tp(deepseek):
    per_token = 70_272
    assert deepseek.kv_bytes_per_gpu(Layout.tp(8), 1000, 0) == per_token * 1000
    assert deepseek.kv_bytes_per_gpu(Layout(1, 8, 1, 8), 1000, 0) == per_token * 1000
    # only DP attention multiplies the sessions an 8-GPU instance holds
    lay_dp = Layout(1, 8, 1, 8)
    per_rank = deepseek.max_sessions(lay_dp, 1000, 0) // 8
    assert per_rank > 0
    assert deepseek.max_sessions(lay_dp, 1000, 0) == 8 * per_rank
    room = deepseek.hw.gpu.memory_bytes - deepseek.static_bytes_per_gpu(lay_dp)
    assert per_rank == int(room // (per_token * 1000))


def test_dp_sessions_go_to_ranks(deepseek):
    lay = Layout(1, 8, 1, 8)
    one_rank = deepseek.memory_per_gpu(lay, [(4000, 0)] * 8, rank=[0] * 8)
    spread = deepseek.memory_per_gpu(lay, [(4000, 0)] * 8)
    assert one_rank - spread == pytest.approx(7 * 70_272 * 4000, rel=1e-12)


def test_pipeline_stages_hold_their_layers(hw):
    m = read_hf_config(INSTANCES / "models" / "qwen3-32b.json")
    pm = PerfModel(m, hw, 2.0, 2.0, 0.0)
    assert stage_layers(10, 3) == [(0, 1, 2, 3), (4, 5, 6), (7, 8, 9)]
    one = pm.weight_bytes_per_gpu(Layout.tp(4))
    two = pm.weight_bytes_per_gpu(Layout(4, 1, 4, 1, pp=2))
    assert two == pytest.approx(one / 2, rel=0.02)
    assert pm.weight_bytes_total(Layout(4, 1, 4, 1, pp=2)) == pytest.approx(pm.weight_bytes_total(Layout.tp(4)), rel=1e-12)


def test_pipeline_eq_6_7(hw):
    assert pipeline_time(4, 8, 1.5) == 11 * 1.5
    assert pipeline_utilisation(4, 8) == pytest.approx(8 / 11)
    m = read_hf_config(INSTANCES / "models" / "qwen3-32b.json")
    pm = PerfModel(m, hw, 2.0, 2.0, 0.0)
    lay = Layout(2, 1, 2, 1, pp=4)
    pos = [1000] * 8
    one = pm.step(lay, pos, microbatches=1)
    four = pm.step(lay, pos, microbatches=4)
    # four micro-batches of 2 sessions: about (q + b - 1) stage times of a 2-session micro-batch
    # (stages differ by the embedding / LM head, hence 5%)
    small = pm.step(lay, pos[:2], microbatches=1)
    assert four.total_s == pytest.approx(small.total_s * (4 + 4 - 1) / 4, rel=0.05)
    assert four.pipeline_s > 0 and one.pipeline_s == 0
    # memory-bound decode: each micro-batch re-reads the stage's weights, so one token for all
    # 8 sessions takes longer in 4 micro-batches (7 stage times of ~the same length) than in one (4)
    assert 1.5 * one.total_s < four.total_s < 2 * one.total_s


def test_alltoall_share_leaving_the_server_uses_the_nic(hw):
    up, out = hw.server.scale_up, hw.server.scale_out
    x = 1e6
    assert hw.alltoall_s(8, x) == pytest.approx(7 * up.alpha_s + x / up.bandwidth_bytes_per_s, rel=1e-12)
    expected = max(7 * up.alpha_s + x * 7 / 15 / up.bandwidth_bytes_per_s, 8 * out.alpha_s + x * 8 / 15 / out.bandwidth_bytes_per_s)
    assert hw.alltoall_s(16, x) == pytest.approx(expected, rel=1e-12)
    assert hw.alltoall_s(1, x) == 0.0


def test_ep_layout_pays_alltoall(qwen235):
    ep = qwen235.step(Layout(1, 8, 1, 8), [CTX - 1] * 8)
    tp = qwen235.step(Layout.tp(8), [CTX - 1] * 8)
    assert ep.alltoall_s > 0 and ep.allreduce_s == 0
    assert tp.alltoall_s == 0 and tp.allreduce_s > 0


def test_readme_worked_example(qwen235):
    """The README's worked example (ms to the last quoted digit)."""
    tp8, ep = Layout.tp(8), Layout(2, 4, 2, 4)
    assert qwen235.step_time_s(tp8, [CTX - 1]) * 1e3 == pytest.approx(3.90, abs=0.005)
    assert qwen235.step(tp8, [CTX - 1]).allreduce_s == pytest.approx(188 * qwen235.hw.allreduce_s(8, 4096 * 2.0), rel=1e-12)
    b8 = qwen235.step(tp8, [CTX - 1] * 8)
    assert b8.active_experts_per_layer == pytest.approx(51.6, abs=0.05)
    assert b8.total_s * 1e3 == pytest.approx(10.54, abs=0.005)
    assert qwen235.max_sessions(ep, CTX, 0) == 64
    assert qwen235.step_time_s(ep, [CTX - 1]) * 1e3 == pytest.approx(4.90, abs=0.005)
    assert qwen235.step_time_s(ep, [CTX - 1] * 8) * 1e3 == pytest.approx(10.95, abs=0.005)


def test_hybrid_state_is_fixed_per_session(hw):
    """Qwen3.5: KV grows only in the 10 full-attention layers; the linear layers' state is fixed
    (read and written back every step), split over TP with the heads."""
    pm = PerfModel(read_hf_config(shared("models", "Qwen--Qwen3.5-35B-A3B.config.json")), hw, 2.0, 2.0, 0.0)
    lay = pm.check(Layout.tp(2))
    kv_token, state = pm.w.kv_bytes_per_token, pm.w.state_bytes_per_session
    assert kv_token == 10 * 2 * 2 * 256 * 2
    a, b = pm.step(lay, [999]), pm.step(lay, [1999])
    assert b.kv_bytes_read - a.kv_bytes_read == pytest.approx(kv_token * 1000 / 2, rel=1e-12)
    assert a.kv_bytes_read == pytest.approx(kv_token * 1000 / 2 + 2 * state / 2, rel=1e-12)
    assert pm.kv_bytes_per_gpu(lay, 100_000, 0) == pytest.approx(kv_token * 100_000 / 2 + state / 2, rel=1e-12)
