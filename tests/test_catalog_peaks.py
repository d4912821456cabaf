"""Dense FP8 / FP4 tensor-core peaks: the catalog's figures and their sources, the per-dtype peak
of a GPU, the roofline's compute term with FP8 weights, and that BF16 figures are unchanged."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from optimizer.catalog import load_catalog
from optimizer.errors import InputError
from optimizer.model.config import read_hf_config
from optimizer.model.hardware import GpuSpec, Hardware, gpu_spec_from_catalog, hardware_from_catalog, peak_flops_for
from optimizer.model.layout import Layout
from optimizer.model.perf import PerfModel
from optimizer.model.prefill import chunk_attention_pairs, forward_pass, prefill_s
from tests.conftest import INSTANCES
from tests.deploy_helpers import book_raw

QWEN32B = INSTANCES / "models" / "qwen3-32b.json"
GPUS = load_catalog()["gpus"]

# Qwen3-32B by hand (config: L 64, H 5120, QH 64, KVH 8, D 128, F 25600, V 151936): matrix
# parameters read per token = L·(attention 2·H·QH·D + 2·H·KVH·D + SwiGLU 3·H·F) + LM head V·H
PARAMS = 64 * (2 * 5120 * 64 * 128 + 2 * 5120 * 8 * 128 + 3 * 5120 * 25600) + 151936 * 5120
ATTN_PER_PAIR = 4 * 64 * 128 * 64  # 4·QH·D per (query, key) pair per layer, all 64 layers (eq. 6-5)


def _perf(gpu: str = "h100-sxm", server: str = "hgx-h100", dtype=None, kv=None) -> PerfModel:
    wb = {None: 2.0, "bf16": 2.0, "fp8": 1.0, "fp4": 0.5}[dtype]
    kvb = {None: 2.0, "bf16": 2.0, "fp8": 1.0}[kv]
    return PerfModel(read_hf_config(QWEN32B), hardware_from_catalog(gpu, server), wb, kvb, 0.0,
                     weight_dtype=dtype, kv_dtype=kv)


# ----------------------------------------------------------------------------- catalog
@pytest.mark.parametrize("name", sorted(GPUS))
def test_every_peak_is_dense_and_cited_in_the_source(name):
    g = GPUS[name]
    src = g["source"]
    if "fp8_tflops" in g:
        assert "FP8" in src
        assert g["fp8_tflops"] >= g["bf16_tflops"]
        assert f"{g['fp8_tflops']:,g}" in src or f"{g['fp8_tflops'] / 1000:g} PFLOPS" in src
    if "fp4_tflops" in g:
        assert "FP4" in src and "fp8_tflops" in g and g["fp4_tflops"] >= g["fp8_tflops"]
        assert f"{g['fp4_tflops']:,g}" in src or f"{g['fp4_tflops'] / 1000:g} PFLOPS" in src


def test_catalog_figures():
    """Datasheet figures halved for 2:4 sparsity: Hopper FP8 is twice BF16, Blackwell FP4 twice FP8."""
    peaks = {n: (g.get("fp8_tflops"), g.get("fp4_tflops")) for n, g in GPUS.items()}
    assert peaks == {"h100-sxm": (1978.9, None), "h200-sxm": (1978.9, None), "h800-sxm": (1978.9, None),
                     "h100-pcie": (1513, None), "b200": (4500, 9000), "a100-sxm-80gb": (None, None),
                     "b300": (4500, 13500), "gb200": (5000, 10000), "gb300": (5000, 15000), "h20": (296, None),
                     "l20": (239, None), "a800-sxm-80gb": (None, None)}
    for n in ("h100-sxm", "h200-sxm", "h800-sxm", "h100-pcie"):
        assert GPUS[n]["fp8_tflops"] / GPUS[n]["bf16_tflops"] == pytest.approx(2.0, rel=1e-3)


def test_gpu_spec_from_catalog_carries_the_peaks():
    h100 = hardware_from_catalog("h100-sxm", "hgx-h100").gpu
    assert (h100.peak_flops, h100.fp8_flops, h100.fp4_flops) == (989.4e12, 1978.9e12, None)
    b200 = gpu_spec_from_catalog("b200", GPUS["b200"])
    assert (b200.peak_flops, b200.fp8_flops, b200.fp4_flops) == (2250e12, 4500e12, 9000e12)
    a100 = hardware_from_catalog("a100-sxm-80gb", "dgx-a100").gpu
    assert (a100.fp8_flops, a100.fp4_flops) == (None, None)


# ----------------------------------------------------------------------------- peak per dtype
def test_peak_flops_for_each_dtype():
    b200 = GpuSpec("b200", 180e9, 8e12, 2250e12, 4500e12, 9000e12)
    assert b200.peak_flops_for("fp8") == 4500e12
    assert b200.peak_flops_for("fp4") == b200.peak_flops_for("nvfp4") == b200.peak_flops_for("NVFP4") == 9000e12
    for d in ("bf16", "fp16", "fp32", "int8", "int4", None):
        assert b200.peak_flops_for(d) == 2250e12
    h100 = GpuSpec("h100", 80e9, 3.35e12, 989.4e12, 1978.9e12)
    assert h100.peak_flops_for("fp4") == 989.4e12  # no FP4 tensor cores: the BF16 peak
    a100 = GpuSpec("a100", 80e9, 2.039e12, 312e12)
    assert a100.peak_flops_for("fp8") == 312e12

    class Bare:  # any object with peak_flops (no per-dtype attributes)
        peak_flops = 1e12

    assert peak_flops_for(Bare(), "fp8") == 1e12


# ----------------------------------------------------------------------------- roofline
def test_fp8_prefill_compute_term_golden_h100():
    """8,192-token prompt, TP1, H100 SXM: the matmul FLOP 2·params·tokens run at the FP8 peak with
    FP8 weights, at the BF16 peak with BF16 weights; attention (BF16 KV) at the BF16 peak in both."""
    n = 8192
    lay = Layout.tp(1)
    matmul = 2 * PARAMS * n
    attn = ATTN_PER_PAIR * n * (n + 1) / 2
    bf16 = forward_pass(_perf(dtype="bf16", kv="bf16"), lay, n, n, chunk_attention_pairs(n, 0))
    fp8 = forward_pass(_perf(dtype="fp8", kv="bf16"), lay, n, n, chunk_attention_pairs(n, 0))
    assert bf16.compute_s == pytest.approx((matmul + attn) / 989.4e12, rel=1e-12)
    assert fp8.compute_s == pytest.approx(matmul / 1978.9e12 + attn / 989.4e12, rel=1e-12)
    assert bf16.compute_s > bf16.local_s and fp8.compute_s > fp8.local_s  # compute bound
    # the matmul part is faster by the FP8/BF16 peak ratio
    attn_s = attn / 989.4e12
    assert (bf16.compute_s - attn_s) / (fp8.compute_s - attn_s) == pytest.approx(1978.9 / 989.4, rel=1e-9)
    # hand figures: 524.0 TFLOP of matmul, 70.4 TFLOP of attention
    assert bf16.compute_s == pytest.approx(0.6008, abs=5e-5)
    assert fp8.compute_s == pytest.approx(0.3359, abs=5e-5)
    assert prefill_s(_perf(dtype="fp8", kv="bf16"), lay, n) == pytest.approx(fp8.total_s, rel=1e-12)


def test_fp8_kv_runs_attention_at_the_fp8_peak():
    n = 8192
    lay = Layout.tp(1)
    both = forward_pass(_perf(dtype="fp8", kv="fp8"), lay, n, n, chunk_attention_pairs(n, 0))
    assert both.compute_s == pytest.approx((2 * PARAMS * n + ATTN_PER_PAIR * n * (n + 1) / 2) / 1978.9e12, rel=1e-12)


def test_batch_table_equals_step_with_fp8_weights():
    from optimizer.model.perf import batch_step_table

    perf = _perf(dtype="fp8", kv="bf16")  # two peaks: FP8 matmuls, BF16 attention
    lay = Layout.tp(2)
    pos = np.array([8000.0, 100.0, 3000.0])
    table = batch_step_table(perf).step_times_s(lay, pos, 4)
    assert table == pytest.approx([perf.step_time_s(lay, pos + j) for j in range(4)], rel=1e-12)


def test_kv_dtype_defaults_to_the_weights_only_when_kv_bytes_do():
    spec, hw = read_hf_config(QWEN32B), hardware_from_catalog("h100-sxm", "hgx-h100")
    assert PerfModel(spec, hw, 1.0, weight_dtype="fp8").attention_peak_flops == 1978.9e12
    assert PerfModel(spec, hw, 1.0, 2.0, weight_dtype="fp8").attention_peak_flops == 989.4e12
    assert PerfModel(spec, hw, 1.0, 1.0).matmul_peak_flops == 989.4e12  # no dtype name: BF16 as before


def test_a100_fp8_weights_compute_at_the_bf16_peak():
    n = 4096
    lay = Layout.tp(1)
    bf16 = forward_pass(_perf("a100-sxm-80gb", "dgx-a100", "bf16", "bf16"), lay, n, n, chunk_attention_pairs(n, 0))
    fp8 = forward_pass(_perf("a100-sxm-80gb", "dgx-a100", "fp8", "fp8"), lay, n, n, chunk_attention_pairs(n, 0))
    assert fp8.compute_s == pytest.approx(bf16.compute_s, rel=1e-12)
    assert fp8.local_s < bf16.local_s  # the weights still read half the bytes


def test_b200_fp4_weights_use_the_fp4_peak():
    n = 8192
    lay = Layout.tp(1)
    fp4 = forward_pass(_perf("b200", "dgx-b200", "fp4", "bf16"), lay, n, n, chunk_attention_pairs(n, 0))
    assert fp4.compute_s == pytest.approx(2 * PARAMS * n / 9000e12 + ATTN_PER_PAIR * n * (n + 1) / 2 / 2250e12,
                                          rel=1e-12)


def test_bf16_figures_unchanged():
    """A BF16 model on a catalog GPU with FP8 figures equals the model on the BF16-only GPU, to the
    bit, for decode steps, batched steps and prefill; and the chapter's 29.35 ms TP1 step at 128K."""
    spec = read_hf_config(QWEN32B)
    hw = hardware_from_catalog("h100-sxm", "hgx-h100")
    old = Hardware(GpuSpec("h100-sxm", hw.gpu.memory_bytes, hw.gpu.hbm_bytes_per_s, hw.gpu.peak_flops), hw.server)
    for dtype in ("bf16", None):
        new_m = PerfModel(spec, hw, 2.0, 2.0, 0.0, weight_dtype=dtype, kv_dtype=dtype)
        old_m = PerfModel(spec, old, 2.0, 2.0, 0.0)
        for p in (1, 2, 8):
            lay = Layout.tp(p)
            pos = [131064, 4000, 17]
            assert new_m.step(lay, pos) == old_m.step(lay, pos)
            assert (new_m.single_session_step_s(lay, pos) == old_m.single_session_step_s(lay, pos)).all()
            assert prefill_s(new_m, lay, 8192) == prefill_s(old_m, lay, 8192)
    one = PerfModel(spec, hw, 2.0, 2.0, 0.0, weight_dtype="bf16", kv_dtype="bf16")
    assert one.single_session_step_s(Layout.tp(1), [131064])[0] * 1e3 == pytest.approx(29.35, abs=0.005)


# ----------------------------------------------------------------------------- instance files
def test_deployment_inline_gpu_accepts_fp8_and_fp4_peaks(tmp_path):
    from optimizer.deployment.perf import PerfModel as DeploymentPerf
    from optimizer.deployment.schema import build_problem

    raw = book_raw()
    raw["model"]["config"] = str(QWEN32B)
    raw["model"]["weight_dtype"] = "fp8"
    raw["hardware"]["gpu"] = {"name": "h100-inline", "memory_gb": 80, "memory_bandwidth_gb_s": 3350,
                              "bf16_tflops": 989.4, "fp8_tflops": 1978.9, "power_w": 700}
    p = build_problem(raw, tmp_path / "i.yaml")
    assert (p.gpu.fp8_flops, p.gpu.fp4_flops, p.weight_dtype, p.kv_dtype) == (1978.9e12, None, "fp8", "bf16")
    assert p.gpu.peak_flops_for("fp8") == 1978.9e12
    assert DeploymentPerf(p).model.matmul_peak_flops == 1978.9e12
    catalog = build_problem(book_raw(), INSTANCES / "qwen32b_128k.yaml")
    assert catalog.gpu.fp8_flops == 1978.9e12 and DeploymentPerf(catalog).model.matmul_peak_flops == 989.4e12
    bad = copy.deepcopy(raw)
    bad["hardware"]["gpu"]["fp8_tflop"] = 1
    with pytest.raises(InputError, match="fp8_tflop"):
        build_problem(bad, tmp_path / "i.yaml")
    neg = copy.deepcopy(raw)
    neg["hardware"]["gpu"]["fp4_tflops"] = 0
    with pytest.raises(InputError, match="fp4_tflops"):
        build_problem(neg, tmp_path / "i.yaml")


def test_supernode_card_accepts_fp8_and_fp4_peaks(tmp_path):
    from optimizer.supernode.schema import SystemIn, load_systems, resolve_hardware
    from tests.supernode_helpers import SMALL_SYSTEM

    system = copy.deepcopy(SMALL_SYSTEM)
    system["card"].update(fp8_tflops=200.0, fp4_tflops=400.0)
    hw = resolve_hardware(SystemIn.model_validate(system), "toy", tmp_path / "i.yaml")
    assert (hw.flops, hw.fp8_flops, hw.fp4_flops) == (100e12, 200e12, 400e12)
    named = resolve_hardware(SystemIn.model_validate(load_systems()["h100-nvl256"]), "h100-nvl256", tmp_path / "i.yaml")
    assert (named.flops, named.fp8_flops, named.fp4_flops) == (989.4e12, 1978.9e12, None)


def test_serving_pools_use_the_weights_peak():
    from tests.serving_helpers import llama8b_raw, problem

    raw = llama8b_raw(1.0, 1024, 128, 1000, 50)
    assert problem(raw).pools[0].perf.matmul_peak_flops == 989.4e12
    raw["model"]["weight_dtype"] = "fp8"
    pool = problem(raw).pools[0]
    assert pool.hw.gpu.fp8_flops == 1978.9e12
    # the KV cache stays BF16 unless asked (one default in every problem): attention at the BF16 peak
    assert (pool.perf.matmul_peak_flops, pool.perf.attention_peak_flops) == (1978.9e12, 989.4e12)
    raw["model"]["kv_dtype"] = "fp8"
    pool = problem(raw).pools[0]
    assert (pool.perf.matmul_peak_flops, pool.perf.attention_peak_flops) == (1978.9e12, 1978.9e12)
