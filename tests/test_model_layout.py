"""Layouts (attention TP x DP, experts TP x EP, PP): validation messages name the field, and
the enumeration equals a brute force over all degree tuples on random small models."""
from __future__ import annotations

import itertools
import random

import pytest

from optimizer.errors import InputError
from optimizer.model.config import LinearAttentionShape, ModelSpec, MoeShape
from optimizer.model.layout import Layout, check_layout, enumerate_layouts, layout_problem


def _spec(q=8, kv=2, layers=4, experts=None, k=2, linear=None):
    moe = MoeShape(experts, k, 64, 0, False, False) if experts else None
    lin = LinearAttentionShape(*linear, 4, 4.0) if linear else None
    return ModelSpec(name="tiny", hidden=256, q_heads=q, kv_heads=kv, head_dim=32, ffn=512, layers=layers,
                     vocab=1000, tied_embeddings=False, qk_norm=False,
                     moe_layers=tuple(range(layers)) if experts else (), moe=moe,
                     linear_layers=(0,) if linear else (), linear=lin)


MOE = _spec(q=16, kv=4, layers=6, experts=12)


@pytest.mark.parametrize("lay,field,words", [
    (Layout(2, 4, 1, 8), "layout.experts.ep", "EP8 does not divide the 12 routed experts"),
    (Layout(2, 2, 1, 2), "layout.experts", "must equal"),
    (Layout(3, 1, 3, 1), "layout.attention.tp", "TP3"),
    (Layout(1, 1, 1, 1, pp=7), "layout.pp", "more than the 6 layers"),
    (Layout(0, 1, 1, 1), "layout.attention.tp", "positive"),
])
def test_bad_layouts_name_the_field(lay, field, words):
    with pytest.raises(InputError) as exc:
        check_layout(MOE, lay, file="inst.yaml")
    assert exc.value.field == field
    assert words in exc.value.line() and "inst.yaml" in exc.value.line()


def test_degrees_must_multiply_to_the_gpus():
    with pytest.raises(InputError) as exc:
        check_layout(MOE, Layout(2, 2, 1, 4, pp=2), gpus=16)
    assert exc.value.field == "layout.gpus"
    assert "8 GPUs, not the 16" in exc.value.line()
    assert check_layout(MOE, Layout(2, 2, 1, 4, pp=2), gpus=8)


def test_kv_heads_split_or_replicated():
    m = _spec(q=8, kv=2)
    assert layout_problem(m, Layout.tp(8)) is None      # TP8 is a multiple of 2 KV heads
    assert layout_problem(m, Layout.tp(2)) is None
    assert layout_problem(_spec(q=12, kv=4), Layout.tp(6))[0] == "attention.tp"  # 6 neither divides nor is a multiple of 4


def test_linear_attention_heads_must_split():
    m = _spec(q=8, kv=8, linear=(2, 4, 16, 16))
    assert layout_problem(m, Layout.tp(2)) is None
    assert layout_problem(m, Layout.tp(4))[0] == "attention.tp"


def test_dense_model_experts_follow_attention():
    m = _spec()
    assert layout_problem(m, Layout(2, 2, 4, 1))[0] == "experts"
    assert layout_problem(m, Layout(2, 2, 2, 1)) is None


def _brute(m, max_gpus):
    out = set()
    r = range(1, max_gpus + 1)
    for atp, adp, etp, ep, pp in itertools.product(r, r, r, r, r):
        lay = Layout(atp, adp, etp, ep, pp)
        if lay.gpus <= max_gpus and layout_problem(m, lay) is None:
            out.add(lay)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_enumeration_equals_brute_force(seed):
    rnd = random.Random(seed)
    kv = rnd.choice([1, 2, 4])
    q = kv * rnd.choice([1, 2, 3, 4])
    experts = rnd.choice([None, 4, 6, 8])
    m = _spec(q=q, kv=kv, layers=rnd.randint(1, 5), experts=experts, k=1)
    got = list(enumerate_layouts(m, 8))
    assert len(got) == len(set(got))
    assert set(got) == _brute(m, 8)
