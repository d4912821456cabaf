"""Real HuggingFace ``config.json`` files (../shared/data/models): dense decoders load with the
right shapes and weight bytes (MoE, MLA and hybrid configs: tests/test_model_inventory.py);
what is still not modelled is refused with "not supported yet: <field>"."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from optimizer.deployment import load, solve
from optimizer.deployment.model_config import read_model_config
from optimizer.deployment.perf import kv_bytes_per_token, weight_bytes
from optimizer.errors import InputError
from tests.conftest import INSTANCES, shared

# (file, hidden, q_heads, kv_heads, head_dim, ffn, layers, vocab, qk_norm): the published shapes
DENSE = [
    ("Qwen--Qwen3-32B.config.json", 5120, 64, 8, 128, 25600, 64, 151936, True),
    ("Qwen--Qwen3-8B.config.json", 4096, 32, 8, 128, 12288, 36, 151936, True),
    ("meta-llama--Meta-Llama-3.1-70B.config.json", 8192, 64, 8, 128, 28672, 80, 128256, False),
]

def _cfg(name: str) -> tuple[Path, dict]:
    p = shared("models", name)
    return p, json.loads(p.read_text())


@pytest.mark.parametrize("name,hidden,qh,kvh,d,ffn,layers,vocab,qk_norm", DENSE)
def test_dense_config_shapes(name, hidden, qh, kvh, d, ffn, layers, vocab, qk_norm):
    path, raw = _cfg(name)
    m = read_model_config(path)
    assert (m.hidden, m.q_heads, m.kv_heads, m.head_dim, m.ffn, m.layers, m.vocab) == \
        (hidden, qh, kvh, d, ffn, layers, vocab)
    assert m.tied_embeddings is False
    assert m.qk_norm is qk_norm
    # the shape is read from the file, not from a table of known models
    assert (raw["hidden_size"], raw["num_hidden_layers"], raw["intermediate_size"]) == (m.hidden, m.layers, m.ffn)


def test_llama_head_dim_is_hidden_over_heads():
    path, raw = _cfg("meta-llama--Meta-Llama-3.1-70B.config.json")
    assert "head_dim" not in raw  # Llama configs do not state it
    m = read_model_config(path)
    assert m.head_dim == raw["hidden_size"] // raw["num_attention_heads"] == 128
    assert m.kv_heads == 8 and m.layers == 80
    assert m.name == "llama"


def test_transcribed_qwen3_32b_matches_published_config():
    ours = read_model_config(INSTANCES / "models" / "qwen3-32b.json")
    theirs = read_model_config(shared("models", "Qwen--Qwen3-32B.config.json"))
    assert ours == theirs


def test_transcribed_qwen3_32b_numbers_match_field_by_field():
    ours = json.loads((INSTANCES / "models" / "qwen3-32b.json").read_text())
    _, theirs = _cfg("Qwen--Qwen3-32B.config.json")
    for key, value in ours.items():
        if key.startswith("_"):
            continue
        assert theirs[key] == value, key


def _resident_bytes_from_formulas(raw: dict, b: float) -> float:
    """Eq. 6-1 terms written out from the raw config fields (dense, untied, no q/k norms)."""
    H, QH, KVH = raw["hidden_size"], raw["num_attention_heads"], raw["num_key_value_heads"]
    D = raw.get("head_dim") or H // QH
    F, L, V = raw["intermediate_size"], raw["num_hidden_layers"], raw["vocab_size"]
    attention = b * (2 * H * QH * D + 2 * H * KVH * D)  # Q, O: H x QH*D; K, V: H x KVH*D
    ffn = 3 * H * F * b  # SwiGLU gate, up, down
    lm_head = V * H * b
    embedding = V * H * b  # tie_word_embeddings is false
    norms = (L * 2 * H + H) * 2  # two RMSNorms per layer and the final one, kept at 2 B
    return L * (attention + ffn) + lm_head + embedding + norms


def test_llama_70b_weight_bytes():
    path, raw = _cfg("meta-llama--Meta-Llama-3.1-70B.config.json")
    assert raw["tie_word_embeddings"] is False
    m = read_model_config(path)
    w = weight_bytes(m, 2.0)
    expected = _resident_bytes_from_formulas(raw, 2.0)
    assert w.resident == expected
    assert w.read_per_step == expected - w.embedding - w.norms
    # ~141 GB at bf16, i.e. ~70.6 B parameters (Meta's "70B")
    assert 140e9 < w.resident < 142e9
    # fp8 weights: every matrix halves, the norms stay 16-bit
    w8 = weight_bytes(m, 1.0)
    assert w8.resident == pytest.approx((expected - w.norms) / 2 + w.norms, rel=1e-15)
    # KV per token: 2 (K, V) x 80 layers x 8 heads x 128 x 2 B = 320 KiB
    assert kv_bytes_per_token(m, 2.0) == 2 * 80 * 8 * 128 * 2 == 320 * 1024


def test_qwen3_32b_published_config_gives_chapter_bytes():
    m = read_model_config(shared("models", "Qwen--Qwen3-32B.config.json"))
    w = weight_bytes(m, 2.0)
    assert w.read_per_step / 1e9 == pytest.approx(63.97, abs=0.005)
    assert w.resident / 1e9 == pytest.approx(65.52, abs=0.005)
    assert kv_bytes_per_token(m, 2.0) == 256 * 1024


def test_unknown_architecture_refused(tmp_path):
    _, raw = _cfg("Qwen--Qwen3-32B.config.json")
    raw["architectures"] = ["GPT2LMHeadModel"]
    p = tmp_path / "c.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(InputError) as exc:
        read_model_config(p)
    assert exc.value.field == "architectures"
    assert "not supported yet" in exc.value.line()


@pytest.mark.parametrize("key,value,field", [
    ("use_sliding_window", True, "sliding_window"),
    ("hidden_act", "gelu", "hidden_act"),
])
def test_unmodelled_features_refused(tmp_path, key, value, field):
    _, raw = _cfg("Qwen--Qwen3-32B.config.json")
    raw[key] = value
    p = tmp_path / "c.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(InputError) as exc:
        read_model_config(p)
    assert exc.value.field == field
    assert "not supported yet" in exc.value.line()


@pytest.mark.parametrize("name,degrees", [
    ("Qwen--Qwen3-8B.config.json", [1, 2, 4, 8]),
    ("meta-llama--Meta-Llama-3.1-70B.config.json", [2, 4, 8]),
])
def test_dense_config_drives_a_solve(tmp_path, name, degrees):
    """Each published dense config works end to end: a small instance solves and the plan
    passes the independent evaluator."""
    raw = {
        "model": {"config": str(shared("models", name))},
        "hardware": {"gpu": "h100-sxm", "server": "hgx-h100"},
        "workload": {"sessions": [
            {"name": "long", "count": 2, "context_tokens": 32768, "new_tokens": 16, "deadline_ms": 400},
            {"name": "short", "count": 2, "context_tokens": 2048, "new_tokens": 16},
        ]},
        "deployment": {"reserve_gib_per_gpu": 2, "tensor_parallel": degrees, "max_batch": 1},
    }
    p = tmp_path / "inst.yaml"
    p.write_text(yaml.safe_dump(raw))
    r = solve(load(p), "cost")
    assert r.status.value == "optimal"
    assert r.outcome.evaluation.violations == []
    assert r.outcome.evaluation.nominal.on_time == 4


@pytest.mark.parametrize("key,value", [("num_hidden_layers", 10**12), ("hidden_size", 10**10), ("vocab_size", 2 * 10**9)])
def test_absurd_config_sizes_are_bad_input_not_a_memory_error(tmp_path, key, value):
    """A fresh user's config with 10^12 layers ended in numpy's 'Unable to allocate 7.28 TiB'
    traceback: config integers have upper limits (10,000 layers, 10^9 otherwise)."""
    from tests.conftest import INSTANCES

    raw = json.loads((INSTANCES / "models" / "qwen3-32b.json").read_text())
    raw[key] = value
    p = tmp_path / "c.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(InputError) as exc:
        read_model_config(p)
    assert exc.value.field == key and "must be at most" in exc.value.line()


def test_a_recurrent_model_type_is_refused_not_timed_as_dense(tmp_path):
    """A fresh-user finding: a config claiming LlamaForCausalLM with model_type mamba was timed as a
    dense transformer; now one line naming model_type."""
    import json

    import pytest

    from optimizer.errors import InputError
    from optimizer.model.config import read_hf_config

    raw = json.loads((INSTANCES / "models" / "llama-3.1-8b.json").read_text())
    raw["model_type"] = "mamba"
    f = tmp_path / "config.json"
    f.write_text(json.dumps(raw))
    with pytest.raises(InputError, match="model_type"):
        read_hf_config(f)
