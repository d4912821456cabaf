"""Memory per GPU (eq. 6-1) of every valid layout of random small models, against an
independent per-GPU tally written from the config fields (no shared data needed).

The tally places each weight piece on each GPU explicitly: stage by layer index, attention
pieces split over attention TP (K/V projections over min(TP, KVH)), routed experts over the
GPU's EP group and split over experts TP, norms and routers whole. Exact (integer bytes).
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from optimizer.model import Layout, PerfModel, enumerate_layouts, hardware_from_catalog
from optimizer.model.config import ModelSpec, MoeShape


def _random_spec(rnd: random.Random) -> ModelSpec:
    kv = rnd.choice([1, 2, 4])
    q = kv * rnd.choice([1, 2, 4])
    layers = rnd.randint(1, 6)
    experts = rnd.choice([None, 4, 8])
    moe = MoeShape(experts, 2, 96, rnd.choice([0, 64]), False, False) if experts else None
    first_dense = rnd.randint(0, layers - 1) if experts else 0
    return ModelSpec(name="rnd", hidden=128, q_heads=q, kv_heads=kv, head_dim=16, ffn=320, layers=layers,
                     vocab=500, tied_embeddings=rnd.random() < 0.3, qk_norm=rnd.random() < 0.5,
                     moe_layers=tuple(range(first_dense, layers)) if experts else (), moe=moe)


def _tally(m: ModelSpec, lay: Layout, b: float) -> float:
    """Bytes on the fullest GPU, from the raw shapes (norms and routers at 2 B)."""
    H, D = m.hidden, m.head_dim
    base, extra = divmod(m.layers, lay.pp)
    bounds, start = [], 0
    for s in range(lay.pp):
        n = base + (1 if s < extra else 0)
        bounds.append(range(start, start + n))
        start += n
    worst = 0.0
    for s, layers in enumerate(bounds):
        g = 0.0
        for i in layers:
            g += (2 * H * m.q_heads * D) * b / lay.attention_tp                       # Q and O
            g += (2 * H * m.kv_heads * D) * b / min(lay.attention_tp, m.kv_heads)     # K and V
            g += (2 * H + (2 * D if m.qk_norm else 0)) * 2.0                          # norms
            if i in m.moe_layers:
                e = m.moe
                mine = e.experts // lay.experts_ep                                    # experts of my EP group
                g += mine * 3 * H * e.expert_ffn * b / lay.experts_tp
                g += e.experts * H * 2.0                                              # router
                g += 3 * H * e.shared_ffn * b / lay.attention_tp
            else:
                g += 3 * H * m.ffn * b / lay.attention_tp
        if s == 0 and (not m.tied_embeddings or lay.pp > 1):
            g += m.vocab * H * b / lay.attention_tp
        if s == lay.pp - 1:
            g += m.vocab * H * b / lay.attention_tp + H * 2.0
        worst = max(worst, g)
    return worst


@pytest.mark.parametrize("seed", range(12))
def test_memory_per_gpu_matches_tally(seed):
    rnd = random.Random(seed)
    m = _random_spec(rnd)
    b = rnd.choice([2.0, 1.0])
    pm = PerfModel(m, hardware_from_catalog("h100-sxm", "hgx-h100"), b, 2.0, 0.0)
    lays = list(enumerate_layouts(m, 8))
    assert lays
    for lay in lays:
        assert pm.weight_bytes_per_gpu(lay) == pytest.approx(_tally(m, lay, b), rel=1e-12), lay


@pytest.mark.parametrize("seed", range(6))
def test_kv_per_gpu_matches_tally(seed):
    rnd = random.Random(100 + seed)
    m = _random_spec(rnd)
    pm = PerfModel(m, hardware_from_catalog("h100-sxm", "hgx-h100"), 2.0, 2.0, 0.0)
    for lay in enumerate_layouts(m, 8):
        layers_first = len(range(*(0, m.layers // lay.pp + (1 if m.layers % lay.pp else 0))))
        per_token = 2 * m.kv_heads * m.head_dim * 2.0 * layers_first
        assert pm.kv_bytes_per_gpu(lay, 1000, 24) == per_token * 1024 / min(lay.attention_tp, m.kv_heads)
        # a batch step reads each session's KV once on its rank
        st = pm.step(lay, np.array([99, 199]), rank=[0, 0])
        if lay.pp == 1:
            assert st.kv_bytes_read == pytest.approx(per_token * 300 / min(lay.attention_tp, m.kv_heads), rel=1e-12)
