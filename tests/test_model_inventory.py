"""Models from HuggingFace ``config.json`` (../shared/data/models): dense, MoE, MLA and hybrid
weight inventories against published parameter counts, KV/state per token and session, the
maximum context as vLLM derives it, bad MoE input, and the decode inventory.

Tolerances: parameter totals within 1% of the published counts (the issue's acceptance);
formula checks are exact (integer arithmetic in float64).
"""
from __future__ import annotations

import json

import pytest

from optimizer.errors import InputError
from optimizer.model import decode_inventory, read_hf_config, weights
from optimizer.model.config import max_model_len
from tests.conftest import INSTANCES, shared

# file -> published total parameters (model cards; DeepSeek-V3 without its MTP layer)
PUBLISHED = {
    "deepseek-ai--DeepSeek-V3.config.json": 671e9,
    "Qwen--Qwen3-235B-A22B.config.json": 235e9,
    "Qwen--Qwen3-30B-A3B.config.json": 30.5e9,
    "Qwen--Qwen3.5-397B-A17B.config.json": 397e9,
}  # Kimi-K2: its config gives about 1.03T (model card: 1.04T), tested on its own below
# published active parameters per token ("A22B" etc.), for a looser sanity check (5%)
ACTIVE = {
    "deepseek-ai--DeepSeek-V3.config.json": 37e9,
    "Qwen--Qwen3-235B-A22B.config.json": 22e9,
    "Qwen--Qwen3-30B-A3B.config.json": 3.3e9,
    "Qwen--Qwen3.5-397B-A17B.config.json": 17e9,
}


def _spec(name, **kw):
    return read_hf_config(shared("models", name), **kw)


def _raw(name):
    return json.loads(shared("models", name).read_text())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_params_match_published(name):
    w = weights(_spec(name), 2.0)
    assert w.params == pytest.approx(PUBLISHED[name], rel=0.01)
    d = w.as_dict()
    assert sum(c["params"] for c in d["components"].values()) == d["params"]
    assert sum(c["bytes"] for c in d["components"].values()) == d["weight_bytes"]


def test_kimi_k2_config_gives_about_1_03_t():
    w = weights(_spec("moonshotai--Kimi-K2-Instruct.config.json"), 2.0)
    assert w.params / 1e12 == pytest.approx(1.03, abs=0.005)


@pytest.mark.parametrize("name", sorted(ACTIVE))
def test_active_params_match_published(name):
    w = weights(_spec(name), 2.0)
    assert w.active_params_per_token == pytest.approx(ACTIVE[name], rel=0.05)


def test_qwen3_235b_components_from_formulas():
    raw = _raw("Qwen--Qwen3-235B-A22B.config.json")
    H, L, E, Fe = raw["hidden_size"], raw["num_hidden_layers"], raw["num_experts"], raw["moe_intermediate_size"]
    QH, KVH, D, V = raw["num_attention_heads"], raw["num_key_value_heads"], raw["head_dim"], raw["vocab_size"]
    c = weights(_spec("Qwen--Qwen3-235B-A22B.config.json"), 2.0).component_params()
    assert c["attention"] == L * (2 * H * QH * D + 2 * H * KVH * D)
    assert c["routed_experts"] == L * E * 3 * H * Fe
    assert c["router"] == L * E * H
    assert c["dense_ffn"] == 0 and c["shared_experts"] == 0
    assert c["embedding"] == c["lm_head"] == V * H
    assert c["norms"] == L * (2 * H + 2 * D) + H


def test_deepseek_v3_layers_and_mla():
    m = _spec("deepseek-ai--DeepSeek-V3.config.json")
    raw = _raw("deepseek-ai--DeepSeek-V3.config.json")
    assert m.moe_layers == tuple(range(raw["first_k_dense_replace"], raw["num_hidden_layers"]))
    assert m.kv_heads == 1  # the latent is shared by all heads
    w = weights(m, 2.0)
    # (kv_lora_rank + qk_rope_head_dim) x layers x bytes
    assert w.kv_bytes_per_token == (512 + 64) * 61 * 2 == 70_272
    c = w.component_params()
    assert c["shared_experts"] == 58 * 3 * 7168 * 2048
    assert c["dense_ffn"] == 3 * 3 * 7168 * 18432
    assert c["router"] == 58 * (256 * 7168 + 256)  # gate and noaux_tc score-correction bias


def test_qwen3_5_hybrid_reads_text_config():
    name = "Qwen--Qwen3.5-397B-A17B.config.json"
    raw = _raw(name)["text_config"]
    m = _spec(name)
    assert len(m.linear_layers) == 45 and m.full_attention_layers == 15
    assert [i for i in range(60) if i not in m.linear_layers] == [i for i, t in enumerate(raw["layer_types"]) if t == "full_attention"]
    w = weights(m, 2.0)
    # KV only in the 15 full-attention layers: 2 x KVH x D x 2 B
    assert w.kv_bytes_per_token == 15 * 2 * 2 * 256 * 2
    # fixed state per session: recurrent nv·dk·dv in float32 + conv (2·nk·dk + nv·dv)·(kernel-1) in bf16
    per_layer = 64 * 128 * 128 * 4 + (2 * 16 * 128 + 64 * 128) * 3 * 2
    assert w.state_bytes_per_session == 45 * per_layer
    assert m.max_context == 262144


def test_full_attention_interval_without_layer_types(tmp_path):
    raw = _raw("Qwen--Qwen3.5-35B-A3B.config.json")
    del raw["text_config"]["layer_types"]
    p = tmp_path / "c.json"
    p.write_text(json.dumps(raw))
    assert read_hf_config(p).linear_layers == _spec("Qwen--Qwen3.5-35B-A3B.config.json").linear_layers


@pytest.mark.parametrize("name,tokens", [
    ("meta-llama--Meta-Llama-3.1-70B.config.json", 131072),   # llama3 keeps max_position_embeddings
    ("Qwen--Qwen3-32B.config.json", 40960),                    # no scaling
    ("deepseek-ai--DeepSeek-V3.config.json", 4096 * 40),       # YaRN original x factor
    ("moonshotai--Kimi-K2-Instruct.config.json", 4096 * 32),
])
def test_max_context_as_vllm(name, tokens):
    assert _spec(name).max_context == tokens


def test_yarn_override_gives_qwen_131k():
    m = _spec("Qwen--Qwen3-32B.config.json",
              rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert m.max_context == 131072


def test_max_model_len_rules(tmp_path):
    p = tmp_path / "c.json"
    assert max_model_len({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2}}, p)[0] == 8192
    assert max_model_len({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "longrope", "factor": 32}}, p)[0] == 131072
    assert max_model_len({}, p)[0] is None
    with pytest.raises(InputError) as exc:
        max_model_len({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 4}}, p)
    assert exc.value.field == "rope_scaling.original_max_position_embeddings"


def test_moe_missing_experts_per_token_names_the_field(tmp_path):
    raw = _raw("Qwen--Qwen3-30B-A3B.config.json")
    del raw["num_experts_per_tok"]
    p = tmp_path / "c.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(InputError) as exc:
        read_hf_config(p)
    assert exc.value.field == "num_experts_per_tok"
    assert "missing" in exc.value.line() and "c.json" in exc.value.line()


def test_transcribed_configs_keep_their_shapes():
    m = read_hf_config(INSTANCES / "models" / "llama-3.1-8b.json")
    assert (m.kind, m.max_context, m.kv_heads) == ("dense", 131072, 8)


@pytest.mark.parametrize("dtype,kv_dtype,kv", [("bf16", None, 70_272), ("fp8", None, 70_272), ("fp8", "fp8", 35_136)])
def test_decode_inventory_deepseek_v3(dtype, kv_dtype, kv):
    """MLA: (512 + 64) x 61 layers per token; KV in BF16 unless asked (DEFAULT_KV_DTYPE, the engines' auto)."""
    path = shared("models", "deepseek-ai--DeepSeek-V3.config.json")
    inv = decode_inventory(path, dtype, kv_dtype)
    w = weights(read_hf_config(path), {"bf16": 2.0, "fp8": 1.0}[dtype])
    assert inv.replicated_resident_bytes + inv.routed_bytes == pytest.approx(w.total_bytes, rel=1e-15)
    assert inv.kv_capacity_bytes.per_context_token == kv
    assert inv.kv_capacity_bytes.fixed == 0
    assert (inv.routed_experts, inv.experts_per_token, inv.moe_layers, inv.layers) == (256, 8, 58, 61)
    assert inv.routed_bytes == inv.moe_layers * inv.routed_experts * inv.expert_bytes
    assert inv.max_context == 163840
    assert inv.replicated_read_bytes < inv.replicated_resident_bytes
    # two FLOP per active parameter read (eq. 6-4): about 37B active minus the embedding and norms
    c = w.component_params()
    assert inv.flops_per_token.fixed / 2 == pytest.approx(w.active_params_per_token - c["embedding"] - c["norms"], rel=1e-12)
