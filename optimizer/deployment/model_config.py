"""Read a HuggingFace ``config.json`` into the shape numbers the performance model needs.

Supported now: dense decoder-only transformers with grouped-query attention and a SwiGLU
FFN (Llama, Qwen2, Qwen3, Mistral without an active sliding window). Other architectures
(MoE, MLA, sliding-window attention, multimodal wrappers) are refused with a clear
"not supported yet: <field>" error rather than modelled wrongly.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from optimizer.errors import InputError

DENSE_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
}
# Fields whose presence (with a non-trivial value) means a feature we do not model yet.
_UNSUPPORTED_FIELDS = (
    "num_experts", "n_routed_experts", "num_local_experts", "moe_intermediate_size",
    "kv_lora_rank", "q_lora_rank", "text_config", "vision_config",
)
_REQUIRED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size")


@dataclass(frozen=True)
class ModelShape:
    """Shape of a dense decoder (symbols of the reference chapter).

    Attributes:
        name: architecture/model type label.
        hidden: H, hidden size.
        q_heads: QH, attention (query) heads.
        kv_heads: KVH, key/value heads (GQA).
        head_dim: D.
        ffn: F, FFN intermediate size (SwiGLU: gate, up and down projections).
        layers: L.
        vocab: V.
        tied_embeddings: the LM head shares the input embedding's weights.
        qk_norm: per-head RMSNorm on q and k (Qwen3), two extra D-sized norms per layer.
    """

    name: str
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    layers: int
    vocab: int
    tied_embeddings: bool
    qk_norm: bool


def _int_field(cfg: dict, key: str, path: Path) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(path, key, f"expected a positive integer (got {v!r})")
    if v <= 0:
        raise InputError(path, key, f"must be positive (got {v})")
    return v


def read_model_config(path: Path) -> ModelShape:
    """Parse a HuggingFace ``config.json``.

    Args:
        path: the config file.
    Returns:
        ModelShape.
    Raises:
        InputError: missing/unreadable file, not JSON, missing or non-positive fields,
            inconsistent heads, or an architecture not supported yet.
    """
    if not path.exists():
        raise InputError(path, "", "model config file not found")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, "", f"cannot read model config: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(path, f"line {exc.lineno}", f"not valid JSON: {exc.msg}") from None
    if not isinstance(cfg, dict):
        raise InputError(path, "", "expected a JSON object")

    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else None
    for key in _UNSUPPORTED_FIELDS:
        value = cfg.get(key)
        if value not in (None, 0, False):
            why = "only dense decoders are modelled for now"
            if isinstance(value, dict):  # multimodal wrapper: say what its text model is, too
                inner = [k for k in _UNSUPPORTED_FIELDS if value.get(k) not in (None, 0, False)]
                why = (f"multimodal wrapper {arch or 'of unknown architecture'}"
                       + (f"; its text model has {', '.join(inner)}" if inner else "")
                       + "; only dense decoder-only configs are modelled for now")
            raise InputError(path, key, f"not supported yet: {key} ({why})")
    if arch is None or arch not in DENSE_ARCHITECTURES:
        raise InputError(path, "architectures", f"not supported yet: architectures={archs!r} "
                         f"(supported: {', '.join(sorted(DENSE_ARCHITECTURES))})")
    if cfg.get("use_sliding_window") or (arch == "MistralForCausalLM" and cfg.get("sliding_window")):
        raise InputError(path, "sliding_window", "not supported yet: sliding_window (KV memory would be overestimated)")
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish", "swiglu"):
        raise InputError(path, "hidden_act", f"not supported yet: hidden_act={act!r} (SwiGLU FFN expected)")

    for key in _REQUIRED:
        _int_field(cfg, key, path)
    hidden = cfg["hidden_size"]
    q_heads = cfg["num_attention_heads"]
    kv_heads = _int_field(cfg, "num_key_value_heads", path) if cfg.get("num_key_value_heads") is not None else q_heads
    if cfg.get("head_dim") is not None:
        head_dim = _int_field(cfg, "head_dim", path)
    else:
        if hidden % q_heads:
            raise InputError(path, "hidden_size", f"{hidden} is not divisible by num_attention_heads={q_heads} and no head_dim is given")
        head_dim = hidden // q_heads
    if q_heads % kv_heads:
        raise InputError(path, "num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={q_heads}")
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise InputError(path, "tie_word_embeddings", f"expected true or false (got {tied!r})")
    return ModelShape(
        name=str(cfg.get("model_type", DENSE_ARCHITECTURES[arch])),
        hidden=hidden,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=cfg["intermediate_size"],
        layers=cfg["num_hidden_layers"],
        vocab=cfg["vocab_size"],
        tied_embeddings=tied,
        qk_norm=DENSE_ARCHITECTURES[arch] == "qwen3",
    )
