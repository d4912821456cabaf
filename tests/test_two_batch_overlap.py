"""Decode two-batch overlap in the step times (issue #26 item 5): ``micro_batches=2`` times a decode
step as two micro-batches (:meth:`PerfModel.stage_step`, :func:`microbatch_pair_s`), in the model,
the deployment and the serving problems and their launch commands.

Golden case: DeepSeek-V3 FP8 on two HGX H200 (``instances/deepseek_v3_two_h200.yaml``), DeepSeek's
decode layout TP1xDP16/EP16 (DP attention, experts EP over both servers, All-to-All over the
NICs), 2,048 sessions at position 8,192 (128 per DP rank: halves of 64). One half, alone:

* the 58 MoE layers (the layers with a collective): compute ``W = max(HBM 18.6508, tensor 10.7642)
  = 18.6508 ms``; communication ``A = 58 x 2 x max(t_up, t_out) = 12.0037 ms``, the dispatch and
  combine of ``64 x 8 x 7168 x 2 B x 15/16 = 6,881,280 B`` per GPU: ``t_out = 8 x 3.76 us +
  (8/15 of it) / 50 GB/s = 103.48 us`` over the NIC, ``t_up = 7 x 0.822 us + (7/15) / 450 GB/s =
  12.89 us`` over NVLink;
* the other layers (3 dense-FFN layers, LM head): ``S = max(0.9353, 0.6160) = 0.9353 ms``, no collective.

With ``c = 2W = 37.3016``, ``a = 2A = 24.0074`` ms: ``2S + min(c + a, max(kappa c, W + A)) + a/(2 x 58)``
= 1.8705 + 37.3016 + 0.2070 = **39.379 ms** at kappa 1 and 1.8705 + 45.6944 + 0.2070 = **47.772 ms**
at kappa 1.225 (experiment 6-5's 64 MiB pair), against 47.781 ms for one batch.
"""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from optimizer.launch import flag_list, overlap_args
from optimizer.model.hardware import Hardware
from optimizer.model.layout import Layout
from optimizer.model.overlap import microbatch_pair_s, microbatch_step_s
from optimizer.model.perf import PerfModel, batch_step_table
from optimizer.model.prefill import mixed_step_s, prefill_s
from tests.conftest import INSTANCES, assert_one_line_error
from tests.serving_helpers import problem, write

DS_INSTANCE = INSTANCES / "deepseek_v3_two_h200.yaml"
EP16 = Layout(1, 16, 1, 16, 1)
W_MS, A_MS, S_MS = 18.6508, 12.0037, 0.9353  # one half's terms (module docstring)
MOE_LAYERS = 58


@pytest.fixture(scope="module")
def ds():
    from optimizer.deployment.schema import build_problem

    prob = build_problem(yaml.safe_load(DS_INSTANCE.read_text()), DS_INSTANCE)
    hw = Hardware(prob.gpu, prob.server, "ring")

    def make(micro_batches=1, kappa=1.0):
        return PerfModel(prob.model, hw, prob.weight_bytes, prob.kv_bytes, prob.reserve_bytes,
                         weight_dtype=prob.weight_dtype, kv_dtype=prob.kv_dtype, micro_batches=micro_batches,
                         contention_kappa=kappa)
    return make


def test_golden_half_terms_are_the_hand_figures(ds):
    pm = ds(2)
    st = pm.stages(1)[0]
    moe, rest = pm.overlap_split(st, EP16)
    assert len(moe.layers) == MOE_LAYERS and rest.layers == (0, 1, 2)  # DeepSeek-V3's first 3 layers are dense
    half = np.full(16, 64.0)
    t = pm.stage_terms(moe, EP16, half, half * 8193, 1024.0)
    assert float(np.max(np.maximum(t.local, t.compute))) * 1e3 == pytest.approx(W_MS, abs=5e-4)
    assert (t.allreduce + t.alltoall) * 1e3 == pytest.approx(A_MS, abs=5e-4)
    # the All-to-All by hand (alpha-beta, pairwise over 8 GPUs per server and 8 over the NICs)
    out = 64 * 8 * 7168 * 2 * 15 / 16
    t_out = 8 * 3.76e-6 + out * 8 / 15 / 50e9
    t_up = 7 * 0.822e-6 + out * 7 / 15 / 450e9
    assert MOE_LAYERS * 2 * max(t_up, t_out) * 1e3 == pytest.approx(A_MS, abs=5e-4)
    r = pm.stage_terms(rest, EP16, half, half * 8193, 1024.0)
    assert float(np.max(np.maximum(r.local, r.compute))) * 1e3 == pytest.approx(S_MS, abs=5e-4)
    assert r.allreduce + r.alltoall == 0.0


@pytest.mark.parametrize("kappa, golden_ms", [(1.0, 39.379), (1.225, 47.772)])
def test_golden_deepseek_v3_ep16_step(ds, kappa, golden_ms):
    c, a = 2 * W_MS, 2 * A_MS
    by_hand = 2 * S_MS + min(c + a, max(kappa * c, W_MS + A_MS)) + min(c, a) / (2 * MOE_LAYERS)
    step = ds(2, kappa).step(EP16, np.full(2048, 8192)).total_s * 1e3
    assert step == pytest.approx(by_hand, abs=2e-3)
    assert round(step, 3) == golden_ms
    assert round(ds(1).step(EP16, np.full(2048, 8192)).total_s * 1e3, 3) == 47.781  # one batch


def test_two_halves_one_after_the_other_bound_the_step(ds):
    """kappa 1: never slower than the halves run one after the other; kappa >= (c + a)/max(c, a):
    exactly that (nothing overlaps)."""
    for n, pos in ((32, 1000), (128, 8192), (512, 4096), (2048, 8192), (1000, 300)):
        positions = np.full(n, pos)
        two = ds(2)
        st = two.stages(1)[0]
        b = np.bincount(np.arange(n) % 16, minlength=16).astype(float)
        mbt = two.microbatch_terms(st, EP16, b, b * (pos + 1), float(n))
        serial = float(np.max(sum(np.maximum(x.local, x.compute) + x.allreduce + x.alltoall
                                  for x in mbt.overlapped + mbt.serial)))
        assert two.step(EP16, positions).total_s <= serial * (1 + 1e-12)
        w = [np.maximum(x.local, x.compute) for x in mbt.overlapped]
        c, a = float(np.max(w[0] + w[1])), sum(x.allreduce + x.alltoall for x in mbt.overlapped)
        for kappa in ((c + a) / max(c, a), 2.0):
            assert ds(2, kappa).step(EP16, positions).total_s == pytest.approx(serial, rel=1e-12)


def test_equal_halves_are_microbatch_step_s_and_odd_ones_wait_for_their_own_collective():
    c, a, L = 8e-3, 5e-3, 58
    for kappa in (1.0, 1.225, 1.5, 2.0):
        got = float(microbatch_pair_s((c / 2, c / 2), (a / 2, a / 2), L, kappa))
        assert got == pytest.approx(min(c + a, microbatch_step_s(c / L, a / L, L, kappa)), rel=1e-12)
    # halves 2:1 of a batch of 3 with W = A per session: the larger half's chain 2w + 2a binds, not 3w
    w = 1e-3
    got = float(microbatch_pair_s((2 * w, w), (2 * w, w), L))
    assert got == pytest.approx(4 * w + 3 * w / (2 * L))
    assert got < float(microbatch_pair_s((2 * w, w), (2 * w, w), L, kappa=2.0)) == pytest.approx(6 * w)


def test_a_batch_of_one_per_rank_is_not_split(ds):
    one, two = ds(1), ds(2)
    for n in (1, 16, 17):  # 17: one rank has two, the others one: no rank micro-batches (all or none)
        pos = np.full(n, 4096)
        assert two.step(EP16, pos).total_s == one.step(EP16, pos).total_s
    assert two.microbatch_halves(np.full(16, 2.0)) is not None
    h1, h2 = two.microbatch_halves(np.array([5.0, 3.0]))
    assert list(h1) == [3.0, 2.0] and list(h2) == [2.0, 1.0]  # a micro-batch holds whole sequences
    lone = Layout.tp(1)  # no collective at all: nothing to overlap, one batch
    assert two.microbatch_terms(two.stages(1)[0], lone, np.array([64.0]), np.array([64.0 * 100]), 64.0) is None


def test_small_batches_pay_for_the_split(ds):
    """Each half reads the weights and pays each collective's latency again: at 8 sessions per
    rank the split costs more than it hides (the engines' thresholds, vLLM's 32-token default, say
    the same); at 128 per rank it saves 8.4 ms."""
    small, large = np.full(128, 8192), np.full(2048, 8192)
    assert ds(2).step(EP16, small).total_s > ds(1).step(EP16, small).total_s
    assert (round(ds(2).step(EP16, small).total_s * 1e3, 1), round(ds(1).step(EP16, small).total_s * 1e3, 1)) == (22.6, 17.3)
    assert ds(1).step(EP16, large).total_s - ds(2).step(EP16, large).total_s == pytest.approx(8.40e-3, abs=0.01e-3)


def test_batch_table_prefill_and_chunks_under_two_micro_batches(ds):
    two, one = ds(2), ds(1)
    pos = np.arange(64) * 97 + 500
    for lay in (EP16, Layout(8, 1, 8, 1, 2)):
        table = batch_step_table(two).step_times_s(lay, pos, 5)
        direct = [two.step(lay, pos + j).total_s for j in range(5)]
        assert table == pytest.approx(direct, rel=1e-9)
    # prefill passes and mixed (chunked-prefill) steps stay one batch; a plain decode step splits
    tp8 = Layout.tp(8)
    assert prefill_s(two, tp8, 4096) == prefill_s(one, tp8, 4096)
    assert mixed_step_s(two, tp8, 512, 0, 64, 4096) == mixed_step_s(one, tp8, 512, 0, 64, 4096)
    assert mixed_step_s(two, tp8, 0, 0, 64, 4096) == pytest.approx(two.step(tp8, np.full(64, 4095)).total_s, rel=1e-9)
    assert mixed_step_s(two, tp8, 0, 0, 64, 4096) != mixed_step_s(one, tp8, 0, 0, 64, 4096)


def test_bad_model_options_are_refused(ds):
    with pytest.raises(ValueError, match="1 or 2"):
        ds(3)
    with pytest.raises(ValueError, match="contention factor"):
        ds(2, 0.9)
    pm = ds(1)
    with pytest.raises(ValueError, match="comm_overlap must be 0"):
        PerfModel(pm.spec, pm.hw, comm_overlap=0.5, micro_batches=2)


# ----------------------------------------------------------------------------- deployment
def _ds_deployment(tmp_path, micro_batches: int, count: int = 64) -> dict:
    raw = yaml.safe_load(DS_INSTANCE.read_text())
    raw["model"]["config"] = str(INSTANCES / "models" / "deepseek-v3.json")
    raw["workload"]["sessions"][0].update(count=count, deadline_ms=200000)
    raw["deployment"]["micro_batches"] = micro_batches
    raw["deployment"]["layouts"] = [{"attention": {"tp": 1, "dp": 16}, "experts": {"tp": 1, "ep": 16}, "gpus": 16}]
    return raw


def test_deployment_plan_is_timed_with_two_micro_batches(cli, tmp_path, ds):
    import json

    f = tmp_path / "ds.yaml"
    f.write_text(yaml.safe_dump(_ds_deployment(tmp_path, 2)))
    r = cli(f, "--objective", "makespan", "--format", "json", "--time-limit", "30")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    inst = d["plan"]["instances"][0]
    assert inst["layout_label"] == "TP1xDP16/EP16" and len(inst["sessions"]) == 64
    # 256 steps of the 64 sessions together (4 per rank, halves of 2), as the shared model times them
    steps = sum(ds(2).step(EP16, np.full(64, 8192 + j)).total_s for j in range(256))
    finish = d["plan"]["makespan_ms"]
    assert finish == pytest.approx(steps * 1e3, rel=1e-4)
    one = sum(ds(1).step(EP16, np.full(64, 8192 + j)).total_s for j in range(256)) * 1e3
    assert finish > one and (round(finish), round(one)) == (4661, 3917)  # docs/deployment.md
    cmds = inst["launch"]
    assert "--enable-two-batch-overlap" in cmds["sglang"] and "--moe-a2a-backend deepep" in cmds["sglang"]
    assert "--enable-dbo" in cmds["vllm"] and "--dbo-decode-token-threshold 2" in cmds["vllm"]


def test_deployment_bound_stays_below_every_step(ds):
    """The fixed part of a step the bound LP counts (weights read + what collectives cannot hide)
    never exceeds a real step under two micro-batches."""
    from optimizer.deployment.params import kv_and_weight_rates, session_step_floor
    from optimizer.model.decode_steps import AnalyticDecode

    class Perf:  # the deployment's view: .model is the shared model, .steps its step-time source
        model = ds(2)
        steps = AnalyticDecode(model)
        max_positions = 4097

    w, kv = kv_and_weight_rates(Perf, EP16)
    for n in (1, 16, 32, 64, 256, 2048):
        for pos in (0, 4096):
            positions = np.full(n, pos)
            step = Perf.model.step(EP16, positions).total_s
            assert w + kv * float(np.sum(positions + 1)) <= step * (1 + 1e-9), (n, pos)
    assert session_step_floor(Perf, Layout.tp(8), w, 64) == 0.0


@pytest.mark.parametrize("change, field", [
    ({"micro_batches": 3}, "deployment.micro_batches"),
    ({"contention_kappa": 0.5, "micro_batches": 2}, "deployment.contention_kappa"),
    ({"contention_kappa": 1.2}, "deployment.contention_kappa"),
])
def test_bad_deployment_overlap_input_is_one_line_exit_2(cli, tmp_path, change, field):
    raw = _ds_deployment(tmp_path, 1)
    raw["deployment"].update(change)
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(raw))
    assert_one_line_error(cli(f), field)


# ----------------------------------------------------------------------------- serving
def _pcie_moe(micro_batches: int, kappa: float = 1.0) -> dict:
    """Qwen3-30B-A3B on PCIe H100 servers (64 GB/s between GPUs, no NVLink): a comm-heavy MoE case."""
    return {"name": "qwen3-30b-a3b on PCIe H100", "model": {"config": "models/qwen3-30b-a3b.json", "hf_id": "Qwen/Qwen3-30B-A3B"},
            "hardware": {"gpu": "h100-pcie", "server": "pcie-h100x8", "servers": 8},
            "performance": {"source": "chapter"},
            "serving": {"traffic": {"rate_rps": 100, "isl": 1024, "osl": 512},
                        "slo": {"ttft_ms": 2000, "tpot_ms": 20}, "mode": "disaggregated",
                        "simulation": {"enabled": False}, "micro_batches": micro_batches,
                        "contention_kappa": kappa}}


def test_serving_comm_heavy_moe_needs_no_more_decode_gpus_with_overlap():
    from optimizer.serving import solve_instance
    from optimizer.serving.perf import ServingModel

    modes = {mb: solve_instance(problem(_pcie_moe(mb))).to_dict()["plan"]["rates"][0]["modes"]["disaggregated"]
             for mb in (1, 2)}
    dec = {mb: sum(w["gpus"] for w in m["workers"] if w["role"] == "decode") for mb, m in modes.items()}
    assert dec[2] <= dec[1], dec
    # the EP8 decode worker serves more with the overlap (TPOT-bound at 20 ms over 64 GB/s links)
    rates = {mb: {w.layout.label(): w.rate for w in ServingModel(problem(_pcie_moe(mb))).workers(roles=("decode",))}
             for mb in (1, 2)}
    assert rates[2]["TP2xDP4/EP8"] > rates[1]["TP2xDP4/EP8"] * 1.1
    # the plan's decode commands carry the flags where the engine overlaps the layout
    for w in modes[2]["workers"]:
        if w["role"] == "decode" and "EP8" in w["layout"] and "xDP" in w["layout"]:
            assert "--enable-dbo" in w["launch"]["vllm"]
        if w["role"] == "prefill":
            assert "--enable-two-batch-overlap" not in w["launch"].get("sglang", "")


def test_overlap_flags_and_notes_per_engine_and_version():
    ep8 = Layout(1, 8, 1, 8, 1)
    have = flag_list("sglang", "0.5.14")
    assert overlap_args("sglang", ep8, True, have, "0.5.14") == (
        ["--enable-two-batch-overlap", "--moe-a2a-backend", "deepep"], None)
    args, note = overlap_args("sglang", Layout.tp(8), True, have, "0.5.14")
    assert args == [] and "expert-parallel All-to-All only" in note
    args, note = overlap_args("sglang", ep8, True, have - {"--enable-two-batch-overlap"}, "0.5.x")
    assert args == [] and "has no --enable-two-batch-overlap" in note
    v = flag_list("vllm", "0.24.0")
    assert overlap_args("vllm", ep8, True, v, "0.24.0")[0][:1] == ["--enable-dbo"]
    assert "DP attention + expert parallelism" in overlap_args("vllm", Layout(8, 1, 1, 8, 1), True, v, "0.24.0")[1]


@pytest.mark.parametrize("change, field, needle", [
    ({"micro_batches": 3}, "serving.micro_batches", ""),
    ({"micro_batches": True}, "serving.micro_batches", ""),
    ({"micro_batches": 2, "contention_kappa": 0.9}, "serving.contention_kappa", ""),
    ({"micro_batches": 2, "contention_kappa": 2.5}, "serving.contention_kappa", ""),
    ({"contention_kappa": 1.2}, "serving.contention_kappa", "two micro-batches"),
    ({"micro_batches": 2, "comm_overlap": 0.5}, "serving.micro_batches", "comm_overlap to 0"),
])
def test_bad_serving_overlap_input_is_one_line_exit_2(cli, tmp_path, change, field, needle):
    raw = _pcie_moe(1)
    raw["serving"].update(change)
    assert_one_line_error(cli(write(tmp_path, raw)), field, needle)


def test_two_micro_batches_under_measured_step_times_are_refused(cli, tmp_path):
    raw = _pcie_moe(2)
    raw["performance"] = {"source": "measured", "engine": "vllm"}
    assert_one_line_error(cli(write(tmp_path, raw)), "serving.micro_batches", "analytic sources only")


def test_default_is_one_batch():
    p = problem(_pcie_moe(1))
    assert all(pl.perf.micro_batches == 1 and pl.perf.contention_kappa == 1.0 for pl in p.pools)
