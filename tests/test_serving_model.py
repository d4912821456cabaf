"""Prefill, mixed steps and KV transfer on the shared performance model (optimizer/model/prefill.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from optimizer.model import Layout, PerfModel, hardware_from_catalog, read_hf_config
from optimizer.model.prefill import (chunk_attention_pairs, forward_pass, kv_bytes_per_request, kv_transfer_s,
                                     mixed_step_s, prefill_s)

MODELS = Path(__file__).resolve().parents[1] / "instances" / "models"


def perf(name: str, gpu="h100-sxm", server="hgx-h100", wb=2.0) -> PerfModel:
    return PerfModel(read_hf_config(MODELS / f"{name}.json"), hardware_from_catalog(gpu, server), wb, 2.0)


@pytest.mark.parametrize("name,lay,wb", [
    ("qwen3-32b", Layout.tp(1), 2.0), ("qwen3-32b", Layout.tp(8), 2.0),
    ("qwen3-30b-a3b", Layout(2, 4, 1, 8, 1), 2.0), ("qwen3-30b-a3b", Layout.tp(4), 2.0),
    ("deepseek-v3", Layout(1, 8, 1, 8, 1), 1.0),
])
def test_decode_pass_is_the_deployment_step(name, lay, wb):
    """A pass of decodes only is exactly PerfModel.step (one code path, no copy)."""
    pm = perf(name, "h200-sxm", "hgx-h200", wb)
    pos = np.array([5, 100, 2047, 4000, 17, 900, 3, 64, 128, 33, 1, 2])
    dp = lay.attention_dp
    rank = np.arange(pos.size) % dp
    b = np.bincount(rank, minlength=dp).astype(float)
    ctx = np.bincount(rank, weights=pos + 1.0, minlength=dp)
    assert forward_pass(pm, lay, b, ctx, ctx).total_s == pytest.approx(pm.step(lay, pos).total_s, rel=1e-12)


def test_uniform_decode_step_equals_step():
    pm = perf("llama-3.1-70b")
    lay = Layout.tp(4)
    assert mixed_step_s(pm, lay, 0, 0, 16, 3000.0) == pytest.approx(pm.step(lay, np.full(16, 2999)).total_s, rel=1e-12)


def test_prefill_flops_include_the_quadratic_attention_term():
    """Qwen3-32B TP1, 32,768 tokens: compute bound, FLOP = 2·params_read·n + 4·QH·D·L·n(n+1)/2."""
    pm = perf("qwen3-32b")
    m = pm.spec
    n = 32768
    c = pm.w.component_params()
    params = c["attention"] + c["dense_ffn"] + c["lm_head"]
    flops = 2 * params * n + 4 * m.q_heads * m.head_dim * m.layers * n * (n + 1) / 2
    assert prefill_s(pm, Layout.tp(1), n) == pytest.approx(flops / 989.4e12, rel=1e-9)
    assert chunk_attention_pairs(n, 0) == n * (n + 1) / 2
    # the chunked prompt costs at least the whole prompt (weights read per chunk)
    chunks = sum(mixed_step_s(pm, Layout.tp(1), 2048, 2048 * k, 0, 0) for k in range(16))
    assert chunks >= prefill_s(pm, Layout.tp(1), n)


def test_kv_bytes_and_transfer_acceptance_numbers():
    """Issue: 131,072 x 262,144 B = 34.36 GB: 687 ms over one 50 GB/s NIC, 86 ms over eight;
    32,768 tokens = 8.59 GB, 50 -> 5 GB/s adds 8.59 x (1/5 - 1/50) = 1.55 s."""
    pm = perf("qwen3-32b")
    assert pm.w.kv_bytes_per_token == 262_144
    big = kv_bytes_per_request(pm, 131_072)
    assert big / 1e9 == pytest.approx(34.36, abs=0.005)
    assert kv_transfer_s(big, 1, 50e9, 0.0) == pytest.approx(0.687, abs=0.0005)
    assert kv_transfer_s(big, 8, 50e9, 0.0) == pytest.approx(0.086, abs=0.0005)
    kv = kv_bytes_per_request(pm, 32_768)
    assert kv / 1e9 == pytest.approx(8.59, abs=0.005)
    d = kv_transfer_s(kv, 1, 5e9, 3.76e-6) - kv_transfer_s(kv, 1, 50e9, 3.76e-6)
    assert d == pytest.approx(kv / 1e9 * (1 / 5 - 1 / 50), rel=1e-12)
    assert d == pytest.approx(1.55, abs=0.005)


def test_layerwise_overlaps_the_transfer():
    kv, L = 8.59e9, 64
    req = kv_transfer_s(kv, 1, 50e9, 0.0, 3.0, L, "request")
    lw = kv_transfer_s(kv, 1, 50e9, 0.0, 3.0, L, "layerwise")
    assert lw == pytest.approx(req / L)  # prefill (3 s) longer than the transfer: only the last layer's share
    slow = kv_transfer_s(kv, 1, 1e9, 0.0, 3.0, L, "layerwise")
    assert slow == pytest.approx(kv / 1e9 - 3.0 * (L - 1) / L)


def test_mla_kv_bytes_per_request():
    """DeepSeek-V3: (kv_lora_rank 512 + rope 64) x 61 layers x 2 B per token."""
    pm = perf("deepseek-v3", "h200-sxm", "hgx-h200", 1.0)
    assert kv_bytes_per_request(pm, 1000) == 1000 * 576 * 61 * 2
