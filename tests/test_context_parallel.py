"""Context parallelism, sequence parallelism and overlap (issue #26 item 4, chapter 6.2.3-6.2.4, 6.4.3):
the chapter's figures, the Qwen3-32B 131,072-token TTFT table (golden, docs/model.md), and the serving
plan that picks a CP prefill worker when the TTFT target needs it."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.model import Layout, PerfModel, hardware_from_catalog, read_hf_config
from optimizer.model.collectives import ring_allreduce_s
from optimizer.model.layout import layout_problem
from optimizer.model.prefill import kv_bytes_per_request, kv_transfer_s, mixed_step_s, prefill_s, prefill_terms
from optimizer.model.sequence import (causal_pairs_contiguous, causal_pairs_zigzag, cp_decode_merge_s,
                                      kv_exchange_layer_s, overlapped_s, sequence_activation_bytes, sp_collective_s,
                                      zigzag_tokens)
from optimizer.serving import solve_instance
from tests.conftest import assert_one_line_error
from tests.serving_helpers import INSTANCES, problem, write

MIB = 2 ** 20
N = 131072
CP_INSTANCE = INSTANCES / "serving_qwen3_32b_long_prompt_cp.yaml"


@pytest.fixture(scope="module")
def qwen32b():
    return read_hf_config(INSTANCES / "models" / "qwen3-32b.json")


@pytest.fixture(scope="module")
def hgx():
    return hardware_from_catalog("h100-sxm", "hgx-h100")


def _perf(spec, hw, mode="ring", **kw):
    return PerfModel(spec, hw, 2.0, 2.0, 2 * 2 ** 30, cp_kv_exchange=mode, **kw)


# ---------------------------------------------------------------- chapter 6.2.4 figures
def test_causal_pairs_of_eight_positions_contiguous_vs_zigzag():
    """36 pairs over 8 positions; contiguous on 2 cards 10 vs 26 (2.6x); zig-zag {1,2,7,8} / {3,4,5,6}: 18 each."""
    c = causal_pairs_contiguous(8, 2)
    z = causal_pairs_zigzag(8, 2)
    assert c.tolist() == [10.0, 26.0] and round(c[1] / c[0], 1) == 2.6
    assert z.tolist() == [18.0, 18.0] and z.sum() == c.sum() == 36
    assert zigzag_tokens(8, 2).tolist() == [4.0, 4.0]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 5000), cp=st.integers(1, 16))
def test_zigzag_keeps_every_pair_and_balances_when_2cp_divides_n(n, cp):
    if n < 2 * cp:
        return
    z = causal_pairs_zigzag(n, cp)
    assert z.sum() == n * (n + 1) / 2 == causal_pairs_contiguous(n, cp).sum()
    assert zigzag_tokens(n, cp).sum() == n
    if n % (2 * cp) == 0:
        assert np.all(z == z[0])
    assert z.max() <= causal_pairs_contiguous(n, cp).max()


# ---------------------------------------------------------------- chapter 6.2.3 figures
def test_sequence_parallel_activation_of_8192_by_4096_on_four_cards():
    """[8192, 4096] BF16 = 64 MiB; TP4 without SP 64 MiB on each (256 MiB in all), with SP 16 MiB each (64 MiB)."""
    assert sequence_activation_bytes(8192, 4096, 4, False) == (64 * MIB, 256 * MIB)
    assert sequence_activation_bytes(8192, 4096, 4, True) == (16 * MIB, 64 * MIB)


def test_sp_reduce_scatter_plus_all_gather_is_the_ring_allreduce_and_differs_from_tree(qwen32b, hgx):
    m = 4096 * 5120 * 2.0
    up = hgx.server.scale_up
    assert sp_collective_s(hgx, 8, m) == pytest.approx(ring_allreduce_s(8, m, up.alpha_s, up.bandwidth_bytes_per_s),
                                                       rel=1e-12)
    ring, best = _perf(qwen32b, hgx), _perf(qwen32b, replace(hgx, allreduce="tree"))
    sp8 = Layout(8, 1, 8, 1, 1, 1, True)
    assert prefill_s(ring, sp8, 4096) == pytest.approx(prefill_s(ring, Layout.tp(8), 4096), rel=1e-12)
    # under tree AllReduce, SP still runs its ReduceScatter + AllGather as rings
    assert prefill_s(best, sp8, 4096) == pytest.approx(prefill_s(ring, Layout.tp(8), 4096), rel=1e-12)
    assert prefill_s(best, Layout.tp(8), 4096) != pytest.approx(prefill_s(ring, Layout.tp(8), 4096), rel=1e-6)


# ---------------------------------------------------------------- overlap (6.4.3)
def test_overlap_fraction_bounds_and_prefill():
    assert overlapped_s(3.0, 2.0, 0.0) == 5.0 and overlapped_s(3.0, 2.0, 1.0) == 3.0
    assert overlapped_s(3.0, 2.0, 0.5) == 4.0 and overlapped_s(1.0, 4.0, 1.0) == 4.0


def test_comm_overlap_hides_the_tp8_allreduces_of_a_long_prefill(qwen32b, hgx):
    none, half, full = (_perf(qwen32b, hgx, comm_overlap=f) for f in (0.0, 0.5, 1.0))
    t0 = prefill_terms(none, Layout.tp(8), N)
    assert prefill_s(none, Layout.tp(8), N) == t0.total_s  # default 0: the sum, as before
    compute = t0.gemm_s + t0.attention_s
    assert t0.total_s == pytest.approx(compute + t0.allreduce_s, rel=1e-9)
    assert prefill_s(half, Layout.tp(8), N) == pytest.approx(compute + 0.5 * t0.allreduce_s, rel=1e-9)
    assert prefill_s(full, Layout.tp(8), N) == pytest.approx(compute, rel=1e-9)
    with pytest.raises(ValueError, match="overlap"):
        _perf(qwen32b, hgx, comm_overlap=1.5)


# ---------------------------------------------------------------- the acceptance TTFT table
GOLDEN_MS = {  # Qwen3-32B BF16, one 131,072-token prompt, HGX H100 at peak (docs/model.md table)
    "ring": {"TP8": 4004.8, "TP4xCP2": 3622.2, "TP2xCP4": 3430.9, "TP1xCP8": 3335.2},
    "allgather": {"TP8": 4004.8, "TP4xCP2": 3631.8, "TP2xCP4": 3459.7, "TP1xCP8": 3402.4},
}
LAYOUTS = [Layout.tp(8), Layout(4, 1, 4, 1, 1, 2), Layout(2, 1, 2, 1, 1, 4), Layout(1, 1, 1, 1, 1, 8)]


@pytest.mark.parametrize("mode", ["ring", "allgather"])
def test_qwen3_32b_131k_ttft_tp8_vs_cp2_cp4_cp8(qwen32b, hgx, mode):
    """TTFT (prefill) of one 131,072-token prompt on 8 H100: TP8 vs TP4xCP2, TP2xCP4, TP1xCP8, print
    precision 0.1 ms. Every layout does the same FLOP (8 GPUs, the compute time is equal); CP removes
    the TP AllReduces of 131K-token activations and adds the K/V exchange (ring: hidden under the
    block attention; all-gather: exposed)."""
    perf = _perf(qwen32b, hgx, mode)
    rows = {lay.label(): prefill_terms(perf, lay, N) for lay in LAYOUTS}
    got = {k: round(t.total_s * 1e3, 1) for k, t in rows.items()}
    assert got == GOLDEN_MS[mode]
    tp8 = rows["TP8"]
    for t in rows.values():
        assert t.gemm_s + t.attention_s == pytest.approx(tp8.gemm_s + tp8.attention_s, rel=1e-9)
        assert t.total_s == pytest.approx(t.gemm_s + t.attention_s + t.allreduce_s + t.kv_exposed_s, rel=1e-9)
        assert t.pairs_per_rank == pytest.approx(N * (N + 1) / 2 / t.cp)
    assert rows["TP8"].total_s == prefill_s(perf, Layout.tp(8), N)
    up = hgx.server.scale_up  # 64 layers x 7 sends of a 16,384-token block of 4,096 B per token (TP1: all 8 KV heads)
    assert rows["TP1xCP8"].allreduce_s == 0.0 and rows["TP1xCP8"].kv_exchange_s == pytest.approx(
        64 * 7 * (up.alpha_s + N / 8 * 4096 / up.bandwidth_bytes_per_s), rel=1e-9)
    if mode == "ring":
        assert all(t.kv_exposed_s == 0.0 for t in rows.values())  # 0.15 ms sends under 4.4 ms block attention
    else:
        assert all(t.kv_exposed_s == t.kv_exchange_s for t in rows.values())
    assert sorted(got, key=got.get) == ["TP1xCP8", "TP2xCP4", "TP4xCP2", "TP8"]


def test_sglang_style_ffn_over_the_worker_brings_back_the_ffn_allreduces(qwen32b, hgx):
    """cp_ffn: worker (SGLang 0.5.14's dense MLP over its global TP group): per dense-FFN layer the
    rank's AllReduce of n/c tokens over TP is replaced by the all-gather + reduce-scatter of all n
    tokens over the worker's 8 GPUs (= the ring AllReduce of TP8 on the whole prompt)."""
    up = hgx.server.scale_up
    row = 5120 * 2.0
    rank = prefill_terms(_perf(qwen32b, hgx, "allgather"), LAYOUTS[2], N)
    worker = prefill_terms(_perf(qwen32b, hgx, "allgather", cp_ffn="worker"), LAYOUTS[2], N)
    extra = 64 * (ring_allreduce_s(8, N * row, up.alpha_s, up.bandwidth_bytes_per_s)
                  - ring_allreduce_s(2, N / 4 * row, up.alpha_s, up.bandwidth_bytes_per_s))
    assert worker.total_s - rank.total_s == pytest.approx(extra, rel=1e-9)
    assert round(worker.total_s * 1e3, 1) == 3746.6
    tp8 = prefill_terms(_perf(qwen32b, hgx, "allgather", cp_ffn="worker"), Layout.tp(8), N)
    assert tp8.total_s == prefill_terms(_perf(qwen32b, hgx), Layout.tp(8), N).total_s  # cp = 1: nothing changes
    with pytest.raises(ValueError, match="cp_ffn"):
        _perf(qwen32b, hgx, cp_ffn="layer")


def test_cp_over_two_tp8_servers_crosses_the_scale_out_network(qwen32b, hgx):
    """TP8xCP2 over 16 GPUs (two HGX): the ring runs over the 50 GB/s NICs and is still hidden (block
    attention 8.9 ms per step vs a 0.67 ms send); the all-gather adds its 43 ms."""
    lay = Layout(8, 1, 8, 1, 1, 2)
    ring = prefill_terms(_perf(qwen32b, hgx, "ring"), lay, N)
    ag = prefill_terms(_perf(qwen32b, hgx, "allgather"), lay, N)
    assert lay.gpus == 16 and ring.kv_exposed_s == 0.0
    assert round(ring.total_s * 1e3, 1) == 2003.1 and round(ag.total_s * 1e3, 1) == 2046.3
    out = hgx.server.scale_out
    assert ag.kv_exposed_s == pytest.approx(64 * (out.alpha_s + N / 2 * 4096 / 8 / out.bandwidth_bytes_per_s), rel=1e-9)


def test_kv_memory_per_gpu_split_by_cp_only_under_the_ring(qwen32b, hgx):
    ring, ag = _perf(qwen32b, hgx, "ring"), _perf(qwen32b, hgx, "allgather")
    kv_token = 64 * 2 * 8 * 128 * 2  # 2·L·KVH·D·b
    for lay in LAYOUTS:
        shards = min(lay.attention_tp, 8)
        assert ring.kv_bytes_per_gpu(lay, N, 0) == pytest.approx(kv_token * N / shards / lay.cp)
        assert ag.kv_bytes_per_gpu(lay, N, 0) == pytest.approx(kv_token * N / shards)
    cp8 = LAYOUTS[-1]
    assert ring.static_bytes_per_gpu(cp8) + ring.kv_bytes_per_gpu(cp8, N, 0) < 80e9  # 72 GB
    assert ag.static_bytes_per_gpu(cp8) + ag.kv_bytes_per_gpu(cp8, N, 0) > 80e9  # 102 GB: the whole KV on TP1


def test_kv_exchange_layer_ring_hides_until_the_send_outlasts_the_block():
    assert kv_exchange_layer_s("ring", 4, 1e6, 8e-3, 1e-6, 1e9) == pytest.approx((3 * 1.001e-3, 0.0))
    assert kv_exchange_layer_s("ring", 4, 1e6, 4e-3, 1e-6, 1e9)[1] == pytest.approx(3e-6)  # 1 us over the 1 ms block
    tot, exp = kv_exchange_layer_s("ring", 4, 1e7, 4e-3, 0.0, 1e9)  # 10 ms send vs 1 ms block
    assert tot == pytest.approx(0.03) and exp == pytest.approx(3 * (0.01 - 0.001))
    assert kv_exchange_layer_s("ring", 4, 1e7, 4e-3, 0.0, 1e9, ring_overlap=0.0)[1] == pytest.approx(0.03)
    assert kv_exchange_layer_s("allgather", 4, 1e6, 4e-3, 0.0, 1e9) == pytest.approx((3e-3, 3e-3))
    assert kv_exchange_layer_s("ring", 1, 1e6, 4e-3, 0.0, 1e9) == (0.0, 0.0)


def test_decode_merge_of_partial_attention():
    """CP4 x TP2, one token, Qwen3-32B heads: 32 heads x (128 + 2) FP32 = 16,640 B per rank, 3 ring steps."""
    assert cp_decode_merge_s(4, 2, 1, 64, 128, 1e-6, 450e9) == pytest.approx(3 * (1e-6 + 16640 / 450e9))
    assert cp_decode_merge_s(1, 2, 1, 64, 128, 1e-6, 450e9) == 0.0


# ---------------------------------------------------------------- layout
def test_layout_cp_sp_fields_label_dict_and_rules(qwen32b):
    lay = Layout(2, 1, 2, 1, 1, 4)
    assert lay.label() == "TP2xCP4" and lay.gpus == 8 and lay.gpus_per_cp_rank == 2
    assert lay.as_dict()["cp"] == 4 and "cp" not in Layout.tp(8).as_dict() and "sp" not in Layout.tp(8).as_dict()
    assert Layout(8, 1, 8, 1, 1, 1, True).label() == "TP8 SP"
    assert layout_problem(qwen32b, lay, 8) is None
    assert layout_problem(qwen32b, Layout(1, 1, 1, 1, 1, 1, True))[0] == "sp"
    assert layout_problem(qwen32b, Layout(2, 1, 2, 1, 1, 0))[0] == "cp"
    assert layout_problem(qwen32b, lay, 4)[0] == "gpus"


def test_allgather_decode_and_chunked_prefill_on_cp_ranks_are_refused(qwen32b, hgx):
    perf = _perf(qwen32b, hgx)
    with pytest.raises(ValueError, match="context-parallel"):
        _perf(qwen32b, hgx, "allgather").step(LAYOUTS[1], [100])
    with pytest.raises(ValueError, match="context-parallel"):
        mixed_step_s(perf, LAYOUTS[1], 2048, 0, 4, 100)
    with pytest.raises(ValueError, match="zig-zag"):
        prefill_terms(perf, LAYOUTS[3], 15)


# ---------------------------------------------------------------- serving
def _raw() -> dict:
    return yaml.safe_load(CP_INSTANCE.read_text())


def test_serving_picks_a_cp_prefill_worker_because_ttft_binds():
    """131K-token prompts, TTFT 3.9 s: every prefill worker without CP misses it even without load
    (TP8 4.08 s), a CP one meets it; the plan is disaggregated with a CP prefill worker, the
    explanation names the TTFT as binding, SGLang gets --attn-cp-size."""
    raw = _raw()
    raw["serving"]["simulation"] = {"enabled": False}
    rep = solve_instance(problem(raw))
    d = rep.to_dict()
    r = d["plan"]["rates"][0]
    assert r["best_mode"] == "disaggregated"
    pre = [g for g in r["modes"]["disaggregated"]["workers"] if g["role"] == "prefill"]
    assert [g["layout"] for g in pre] == ["TP2xCP4"] and pre[0]["layout_detail"]["cp"] == 4
    tp8 = next(c for c in d["plan"]["configurations"] if c["label"] == "prefill TP8 on h100-sxm")
    assert tp8["limited_by"] == "ttft" and tp8["rate_per_worker_rps"] == 0
    why = next(b for b in d["binding"] if b["family"] == "context_parallel")
    assert why["slack"] < 0 and "TTFT binding" in why["detail"] and "TP8" in why["detail"]
    perf = problem(raw).pools[0].perf  # TP8's zero-load TTFT: its prefill plus the KV over its 8 NICs of 50 GB/s
    tp8_ttft = prefill_s(perf, Layout.tp(8), 130816) + kv_transfer_s(kv_bytes_per_request(perf, 130816), 8, 50e9, 3.76e-6)
    assert why["slack"] == pytest.approx((3.9 - tp8_ttft) * 1e3, rel=1e-9)
    cmd = pre[0]["launch"]["sglang"]
    assert "--attn-cp-size 4" in cmd and "--enable-prefill-cp" in cmd and "--cp-strategy zigzag" in cmd
    assert "--tp-size 8" in cmd and "--chunked-prefill-size -1" in cmd and "SGLANG_ENABLE_CP_V2=1" in cmd
    assert any("context-parallel prefill (TP2xCP4)" in n for n in d["notes"])


def test_without_cp_the_same_instance_has_no_plan():
    raw = _raw()
    raw["serving"]["simulation"] = {"enabled": False}
    raw["serving"]["prefill"] = {"cp": [1]}
    d = solve_instance(problem(raw)).to_dict()
    assert d["status"] == "infeasible"


def test_vllm_gets_no_cp_command_and_the_plan_says_why():
    raw = _raw()
    raw["serving"].update(simulation={"enabled": False}, engine="both")
    d = solve_instance(problem(raw)).to_dict()
    pre = next(g for g in d["plan"]["rates"][0]["modes"]["disaggregated"]["workers"] if g["role"] == "prefill")
    assert set(pre["launch"]) == {"sglang"}
    assert "vLLM 0.24.0 has --prefill-context-parallel-size" in pre["launch_notes"][0]
    dec = next(g for g in d["plan"]["rates"][0]["modes"]["disaggregated"]["workers"] if g["role"] == "decode")
    assert set(dec["launch"]) == {"vllm", "sglang"} and "launch_notes" not in dec


def test_serving_cp_instance_simulates_within_the_slo(cli):
    r = cli(CP_INSTANCE, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    m = d["plan"]["rates"][0]["modes"]["disaggregated"]
    assert m["simulated"]["attainment"] >= 0.9


@pytest.mark.parametrize("change, field, needle", [
    ({"decode": {"cp": [2]}}, "serving.decode.cp", "prefill workers only"),
    ({"aggregated": {"cp": [1, 2]}}, "serving.aggregated.cp", "prefill workers only"),
    ({"prefill": {"cp": [16]}}, "serving.prefill.cp", "a server has 8"),
    ({"prefill": {"cp": [2, 2]}}, "serving.prefill.cp", "distinct"),
    ({"mode": "aggregated"}, "serving.prefill.cp", "disaggregated"),
    ({"comm_overlap": 1.5}, "serving.comm_overlap", ""),
    ({"cp_kv_exchange": "tree"}, "serving.cp_kv_exchange", ""),
    ({"cp_ffn": "layer"}, "serving.cp_ffn", ""),
])
def test_bad_cp_input_is_one_line_exit_2(cli, tmp_path, change, field, needle):
    raw = _raw()
    raw["serving"].update(change)
    assert_one_line_error(cli(write(tmp_path, raw)), field, needle)


def test_docs_model_table_is_the_model(qwen32b, hgx):
    """docs/model.md's CP table: the TTFT columns (ring, all-gather) are prefill_terms at print precision."""
    from tests.serving_helpers import REPO

    text = (REPO / "docs" / "model.md").read_text()
    rows = {line.split("|")[1].strip(): line.split("|") for line in text.splitlines()
            if line.startswith("| TP") and "CP" in line or line.startswith("| TP8 |")}
    lays = {lay.label(): lay for lay in LAYOUTS + [Layout(8, 1, 8, 1, 1, 2)]}
    for name, cells in rows.items():
        lay = lays[name.split(" ")[0]]
        ring = prefill_terms(_perf(qwen32b, hgx, "ring"), lay, N).total_s
        ag = prefill_terms(_perf(qwen32b, hgx, "allgather"), lay, N).total_s
        sg = prefill_terms(_perf(qwen32b, hgx, "allgather", cp_ffn="worker"), lay, N).total_s
        assert (float(cells[10]), float(cells[11]), float(cells[12])) == (round(ring, 4), round(ag, 4), round(sg, 4)), name
    assert len(rows) == 5


def test_fixed_plan_with_a_cp_prefill_worker(cli_any, tmp_path):
    """``optimize estimate`` of 1 x TP2xCP4 prefill + 1 x TP2 decode: the CP worker is timed as in the
    optimiser (8 GPUs); a CP decode worker is refused with one line."""
    from optimizer.serving.estimate import fixed_workers

    raw = _raw()
    raw["serving"]["fixed"] = {"workers": [{"role": "prefill", "tp": 2, "cp": 4}, {"role": "decode", "tp": 2}]}
    workers, counts, mode = fixed_workers(problem(raw))
    assert mode == "disaggregated" and workers[0].layout.label() == "TP2xCP4" and workers[0].gpus == 8
    r = cli_any("estimate", write(tmp_path, raw))
    assert r.exit_code == 0, r.output
    raw["serving"]["fixed"]["workers"][1]["cp"] = 2
    assert_one_line_error(cli_any("estimate", write(tmp_path, raw, "b.yaml")), "serving.fixed.workers[1].cp",
                          "prefill workers only")
