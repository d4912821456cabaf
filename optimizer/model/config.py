"""Read a HuggingFace ``config.json`` into a :class:`ModelSpec`.

Supported: decoder-only transformers with

* grouped-query attention (Llama, Qwen2/3, Mistral without an active sliding window),
* multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2; ``kv_lora_rank``, ``q_lora_rank``,
  ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``),
* mixture-of-experts FFNs (Qwen3-MoE ``num_experts``/``decoder_sparse_step``/``mlp_only_layers``;
  DeepSeek ``n_routed_experts``/``n_shared_experts``/``first_k_dense_replace``/``moe_layer_freq``;
  Mixtral ``num_local_experts``; Qwen3.5/Qwen3-Next ``shared_expert_intermediate_size``),
* hybrid linear attention (Qwen3.5 / Qwen3-Next Gated DeltaNet: ``layer_types`` or
  ``full_attention_interval``; multimodal wrappers are read through their ``text_config``).

Anything else (sliding windows, other activations, unknown architectures) is refused with
"not supported yet: <field>" rather than modelled wrongly. Multi-token-prediction layers
(``num_nextn_predict_layers``: DeepSeek-V3/R1; ``mtp_num_hidden_layers``: Qwen3-Next / Qwen3.5)
are not part of the served text model's layers: they are read into :attr:`ModelSpec.mtp_layers`
and counted (weights, KV, step time) only when speculative decoding uses them
(:mod:`optimizer.model.speculative`, ``speculative.method: mtp``). Vision towers are not counted.

The maximum context follows vLLM's ``max_model_len`` derivation (``_get_and_verify_max_len``):
``max_position_embeddings``, times the RoPE scaling ``factor`` for scaling types that extend the
window (YaRN uses ``original_max_position_embeddings x factor``); ``llama3``, ``longrope``/``su``
and ``default``/``mrope`` keep ``max_position_embeddings`` as stated.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from optimizer.errors import InputError, warn_input

# architecture -> family label used in messages
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
}
# families whose attention carries per-head RMSNorms on q and k (two D-sized norms per layer)
_QK_NORM = {"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe"}
# families whose HF config class (or attention module) takes head_dim = hidden_size //
# num_attention_heads when the config.json has no head_dim: LlamaConfig, MistralConfig and
# MixtralConfig (``head_dim=None`` -> ``hidden_size // num_attention_heads``), Qwen2 and Qwen3-MoE
# (no head_dim field; the attention uses ``getattr(config, "head_dim", hidden_size //
# num_attention_heads)``). Qwen3Config defaults head_dim to 128 and Qwen3-Next / Qwen3.5 to 256:
# for those (and any other family) an absent head_dim is bad input.
_HEAD_DIM_FROM_HIDDEN = {"llama", "mistral", "mixtral", "qwen2", "qwen3_moe"}
# RoPE scaling types whose factor does not extend max_position_embeddings (vLLM)
_NO_EXTENSION = {"llama3", "longrope", "su", "default", "mrope"}
_DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "fp32": 4.0, "bfloat16": 2.0, "float16": 2.0, "bf16": 2.0, "fp16": 2.0}


@dataclass(frozen=True)
class MlaShape:
    """Multi-head latent attention (DeepSeek-V2 paper, sec. 2.1).

    Attributes:
        kv_lora_rank: width of the compressed KV latent (cached per token and layer).
        q_lora_rank: width of the compressed query, or None when queries are projected directly.
        qk_rope_head_dim: decoupled RoPE key width (cached per token and layer, shared by heads).
        qk_nope_head_dim: per-head query/key width without RoPE.
        v_head_dim: per-head value width.
    """

    kv_lora_rank: int
    q_lora_rank: Optional[int]
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoeShape:
    """Mixture-of-experts FFN.

    Attributes:
        experts: E, routed experts per MoE layer.
        experts_per_token: k, routed experts each token visits (top-k).
        expert_ffn: intermediate size of one routed expert (SwiGLU).
        shared_ffn: total intermediate size of the always-on shared expert(s) (0: none).
        shared_gate: a sigmoid gate ``H x 1`` scales the shared expert (Qwen3.5 / Qwen3-Next).
        router_bias: the router has a per-expert score-correction bias (DeepSeek-V3 ``noaux_tc``).
    """

    experts: int
    experts_per_token: int
    expert_ffn: int
    shared_ffn: int
    shared_gate: bool
    router_bias: bool


@dataclass(frozen=True)
class LinearAttentionShape:
    """Gated DeltaNet linear attention (Qwen3-Next / Qwen3.5).

    Attributes:
        k_heads, v_heads: key and value heads.
        k_dim, v_dim: key and value head widths.
        conv_kernel: causal convolution width.
        state_bytes: bytes per element of the recurrent state (``mamba_ssm_dtype``; float32: 4).
    """

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int
    state_bytes: float

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: q, k and v (``2·nk·dk + nv·dv``)."""
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only LLM (symbols of the reference chapter).

    Attributes:
        name: ``model_type`` of the (text) config.
        hidden: H.
        q_heads: QH, query heads of the (full) attention layers.
        kv_heads: KVH, KV heads held in the cache (GQA); 1 for MLA, whose latent is shared by all heads.
        head_dim: D, per-head width of the (full) attention; for MLA ``qk_nope + qk_rope``.
        ffn: F, intermediate size of dense FFN layers (SwiGLU).
        layers: L, Transformer blocks.
        vocab: V.
        tied_embeddings: the LM head shares the input embedding's weights.
        qk_norm: per-head RMSNorm on q and k.
        moe_layers: indices of the blocks whose FFN is a mixture of experts.
        linear_layers: indices of the blocks with linear attention (a fixed-size state per session).
        moe, mla, linear: the feature shapes (None when absent).
        attn_output_gate: the query projection also produces an output gate (Qwen3.5: doubles q_proj).
        max_context: longest sequence the model accepts (tokens), or None when the config states none.
        max_context_source: how ``max_context`` was derived (for messages).
        mtp_layers: multi-token-prediction modules the checkpoint carries (``num_nextn_predict_layers``
            or ``mtp_num_hidden_layers``; 0: none). Not in ``layers``; used by MTP speculative decoding.
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
    moe_layers: tuple[int, ...] = ()
    linear_layers: tuple[int, ...] = ()
    moe: Optional[MoeShape] = None
    mla: Optional[MlaShape] = None
    linear: Optional[LinearAttentionShape] = None
    attn_output_gate: bool = False
    max_context: Optional[int] = None
    max_context_source: str = ""
    mtp_layers: int = 0

    @property
    def full_attention_layers(self) -> int:
        """Blocks with (softmax) attention and a KV cache."""
        return self.layers - len(self.linear_layers)

    @property
    def kind(self) -> str:
        """"dense", "moe", plus "+mla" / "+hybrid" (for reports)."""
        k = "moe" if self.moe else "dense"
        if self.mla:
            k += "+mla"
        if self.linear:
            k += "+hybrid"
        return k


# Upper limits of config integers (far beyond any published model): the layer and expert counts
# size per-layer and per-expert arrays (a fresh user's 10^12 layers asked numpy for 7 TiB)
CONFIG_INT_MAX = 10**9
CONFIG_INT_CAPS = {"num_hidden_layers": 10_000, "n_routed_experts": 100_000, "num_experts": 100_000,
                   "num_local_experts": 100_000, "num_experts_per_tok": 100_000}


def _int(cfg: dict, key: str, path: Path, *, allow_zero: bool = False) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(path, key, f"expected a {'non-negative' if allow_zero else 'positive'} integer (got {v!r})")
    if v < 0 or (v == 0 and not allow_zero):
        raise InputError(path, key, f"must be {'non-negative' if allow_zero else 'positive'} (got {v})")
    cap = CONFIG_INT_CAPS.get(key, CONFIG_INT_MAX)
    if v > cap:
        raise InputError(path, key, f"must be at most {cap:,} (got {v:,})")
    return v


def _opt_int(cfg: dict, key: str, path: Path, default: Optional[int]) -> Optional[int]:
    return _int(cfg, key, path) if cfg.get(key) is not None else default


def max_model_len(cfg: dict, path: Path, rope_scaling: Optional[dict] = None) -> tuple[Optional[int], str]:
    """Longest sequence (prompt + generated tokens) a config accepts, as vLLM derives ``max_model_len``.

    Args:
        cfg: the (text) config mapping.
        path: the config file (for messages).
        rope_scaling: an override of the config's ``rope_scaling`` (e.g. from the instance), or None.
    Returns:
        (tokens or None when the config states no length, a short description of the derivation).
    Raises:
        InputError: a malformed ``rope_scaling`` (missing ``factor`` or, for YaRN, the original length).

    Source: vLLM ``vllm/config`` ``_get_and_verify_max_len``: YaRN gives
    ``original_max_position_embeddings x factor``; other extending types multiply
    ``max_position_embeddings`` by ``factor``; ``llama3``, ``longrope``/``su``, ``default`` and
    ``mrope`` keep ``max_position_embeddings``.
    """
    base = cfg.get("max_position_embeddings")
    if base is not None:
        base = _int(cfg, "max_position_embeddings", path)
    field = "rope_scaling"
    rs = rope_scaling if rope_scaling is not None else cfg.get("rope_scaling")
    if rs is None and isinstance(cfg.get("rope_parameters"), dict):
        rs, field = cfg["rope_parameters"], "rope_parameters"
    if not rs:
        return base, f"max_position_embeddings {base}" if base is not None else "not stated"
    if not isinstance(rs, dict):
        raise InputError(path, field, f"expected a mapping (got {rs!r})")
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind in _NO_EXTENSION or "factor" not in rs and kind not in ("yarn",):
        return base, f"max_position_embeddings {base} (rope_type {kind})" if base is not None else "not stated"
    factor = rs.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
        raise InputError(path, f"{field}.factor", f"expected a positive number for rope_type {kind} (got {factor!r})")
    if kind == "yarn":
        orig = rs.get("original_max_position_embeddings")
        if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0:
            raise InputError(path, f"{field}.original_max_position_embeddings",
                             f"YaRN needs a positive integer (got {orig!r})")
        return int(orig * factor), f"YaRN original_max_position_embeddings {orig} x factor {factor:g}"
    if base is None:
        return None, "not stated"
    return int(base * factor), f"max_position_embeddings {base} x {kind} factor {factor:g}"


def _moe(cfg: dict, path: Path) -> tuple[Optional[MoeShape], tuple[int, ...]]:
    layers = cfg["num_hidden_layers"]
    for key in ("n_routed_experts", "num_experts", "num_local_experts"):
        if cfg.get(key) not in (None, 0):
            experts = _int(cfg, key, path)
            break
    else:
        zero = [key for key in ("n_routed_experts", "num_experts", "num_local_experts") if key in cfg]
        if zero and cfg.get("num_experts_per_tok"):  # 0 experts but each token visits some: not a dense model
            raise InputError(path, zero[0], f"is 0 while num_experts_per_tok is {cfg['num_experts_per_tok']}: a MoE "
                                            f"config needs its routed expert count (a dense config has neither)")
        return None, ()
    if cfg.get("num_experts_per_tok") is None:
        raise InputError(path, "num_experts_per_tok", f"missing: a MoE config ({key} {experts}) must say how many experts each token visits")
    k = _int(cfg, "num_experts_per_tok", path)
    if k > experts:
        raise InputError(path, "num_experts_per_tok", f"{k} is more than the {experts} routed experts")
    if key == "num_local_experts":  # Mixtral: every FFN is a MoE of intermediate_size experts
        expert_ffn = _int(cfg, "intermediate_size", path)
        moe_layers = tuple(range(layers))
    else:
        if cfg.get("moe_intermediate_size") is None:
            raise InputError(path, "moe_intermediate_size", f"missing: a MoE config ({key} {experts}) must give the expert FFN size")
        expert_ffn = _int(cfg, "moe_intermediate_size", path)
        if key == "n_routed_experts":  # DeepSeek / Kimi
            first = _int(cfg, "first_k_dense_replace", path, allow_zero=True) if "first_k_dense_replace" in cfg else 0
            freq = _int(cfg, "moe_layer_freq", path) if "moe_layer_freq" in cfg else 1
            moe_layers = tuple(i for i in range(layers) if i >= first and i % freq == 0)
        else:  # Qwen3-MoE / Qwen3.5 / Qwen3-Next
            step = _int(cfg, "decoder_sparse_step", path) if cfg.get("decoder_sparse_step") is not None else 1
            only = cfg.get("mlp_only_layers") or []
            if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in only):
                raise InputError(path, "mlp_only_layers", f"expected a list of layer indices in 0..{layers - 1} (got {only!r})")
            moe_layers = tuple(i for i in range(layers) if i not in only and (i + 1) % step == 0)
    shared_ffn = 0
    if cfg.get("n_shared_experts"):
        shared_ffn = _int(cfg, "n_shared_experts", path) * expert_ffn
    elif cfg.get("shared_expert_intermediate_size"):
        shared_ffn = _int(cfg, "shared_expert_intermediate_size", path)
    return MoeShape(
        experts=experts, experts_per_token=k, expert_ffn=expert_ffn, shared_ffn=shared_ffn,
        shared_gate=bool(cfg.get("shared_expert_intermediate_size")),
        router_bias=cfg.get("topk_method") == "noaux_tc",
    ), moe_layers


def _linear(cfg: dict, path: Path) -> tuple[Optional[LinearAttentionShape], tuple[int, ...]]:
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise InputError(path, "layer_types", f"expected a list of {layers} entries (num_hidden_layers)")
        bad = [t for t in types if t not in ("full_attention", "linear_attention")]
        if bad:
            raise InputError(path, "layer_types", f"not supported yet: layer type {bad[0]!r} (full_attention or linear_attention expected)")
        linear = tuple(i for i, t in enumerate(types) if t == "linear_attention")
    elif cfg.get("full_attention_interval") is not None:
        n = _int(cfg, "full_attention_interval", path)
        linear = tuple(i for i in range(layers) if (i + 1) % n)
    else:
        return None, ()
    if not linear:
        return None, ()
    for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"):
        if cfg.get(key) is None:
            raise InputError(path, key, "missing: a hybrid config with linear-attention layers needs it")
    dtype = cfg.get("mamba_ssm_dtype", "float32")
    if dtype not in _DTYPE_BYTES:
        raise InputError(path, "mamba_ssm_dtype", f"unknown dtype {dtype!r}")
    return LinearAttentionShape(
        k_heads=_int(cfg, "linear_num_key_heads", path), v_heads=_int(cfg, "linear_num_value_heads", path),
        k_dim=_int(cfg, "linear_key_head_dim", path), v_dim=_int(cfg, "linear_value_head_dim", path),
        conv_kernel=_int(cfg, "linear_conv_kernel_dim", path), state_bytes=_DTYPE_BYTES[dtype],
    ), linear


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``. Raises InputError (missing, unreadable, not a JSON object)."""
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
    return cfg


RECURRENT_MODEL_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv5", "rwkv6", "jamba", "zamba",
                                   "zamba2", "recurrent_gemma", "xlstm"})
"""HF ``model_type`` values of state-space and recurrent models: no attention KV, a per-layer
state instead; refused rather than timed as the transformer their ``architectures`` may claim."""


def parse_config(raw: dict[str, Any], path: Path, rope_scaling: Optional[dict] = None) -> ModelSpec:
    """Turn a HuggingFace config mapping into a :class:`ModelSpec` (see the module docstring).

    Args:
        raw: the parsed ``config.json``.
        path: its file (for messages).
        rope_scaling: instance override of ``rope_scaling`` (None: the config's own).
    Raises:
        InputError: missing or non-positive fields, inconsistent heads, a MoE config without
            ``num_experts_per_tok``, or a feature/architecture not supported yet.
    """
    archs = raw.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch is None or arch not in ARCHITECTURES:
        raise InputError(path, "architectures", f"not supported yet: architectures={archs!r} "
                         f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    family = ARCHITECTURES[arch]
    cfg = raw
    if "text_config" in raw:
        cfg = raw["text_config"]
        if not isinstance(cfg, dict):
            raise InputError(path, "text_config", "expected a mapping (the text model's config)")
    mtype = cfg.get("model_type", raw.get("model_type"))
    if isinstance(mtype, str) and mtype.lower() in RECURRENT_MODEL_TYPES:
        raise InputError(path, "model_type", f"not supported yet: model_type={mtype!r} is a state-space/recurrent "
                                             f"model, but architectures={arch} would time it as a transformer")
    tied_src = cfg if "tie_word_embeddings" in cfg else raw
    if cfg.get("use_sliding_window") or (family in ("mistral", "mixtral") and cfg.get("sliding_window")):
        raise InputError(path, "sliding_window", "not supported yet: sliding_window (KV memory would be overestimated)")
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish", "swiglu"):
        raise InputError(path, "hidden_act", f"not supported yet: hidden_act={act!r} (SwiGLU FFN expected)")
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"):
        _int(cfg, key, path)
    hidden, q_heads, layers = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    moe, moe_layers = _moe(cfg, path)
    dense_layers = layers - len(moe_layers)
    ffn = _int(cfg, "intermediate_size", path) if (dense_layers or cfg.get("intermediate_size") is not None) else 0

    mla = None
    other_mla = [k for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim") if cfg.get(k)]
    if not cfg.get("kv_lora_rank") and other_mla:  # an MLA config (DeepSeek-V2/V3, Kimi-K2) missing its latent width
        raise InputError(path, "kv_lora_rank", f"missing (or 0): the config has the MLA fields {', '.join(other_mla)}, "
                                               f"and MLA caches a kv_lora_rank-wide latent per token and layer")
    if cfg.get("kv_lora_rank"):
        for key in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if cfg.get(key) is None:
                raise InputError(path, key, "missing: an MLA config (kv_lora_rank) needs it")
        mla = MlaShape(
            kv_lora_rank=_int(cfg, "kv_lora_rank", path), q_lora_rank=_opt_int(cfg, "q_lora_rank", path, None),
            qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", path), qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", path),
            v_head_dim=_int(cfg, "v_head_dim", path))
        kv_heads, head_dim = 1, mla.qk_nope_head_dim + mla.qk_rope_head_dim
    else:
        kv_heads = _int(cfg, "num_key_value_heads", path) if cfg.get("num_key_value_heads") is not None else q_heads
        if cfg.get("head_dim") is not None:
            head_dim = _int(cfg, "head_dim", path)
        else:
            mtype = cfg.get("model_type", raw.get("model_type", family))
            if family not in _HEAD_DIM_FROM_HIDDEN:
                raise InputError(path, "head_dim", f"absent, and the HF default for model_type {mtype} ({arch}) is "
                                 f"not hidden_size/num_attention_heads; add head_dim")
            if hidden % q_heads:
                raise InputError(path, "hidden_size", f"{hidden} is not divisible by num_attention_heads={q_heads} and no head_dim is given")
            head_dim = hidden // q_heads  # the format's own rule for these families: no warning
        if q_heads % kv_heads:
            raise InputError(path, "num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={q_heads}")
    linear, linear_layers = _linear(cfg, path)
    tied = tied_src.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise InputError(path, "tie_word_embeddings", f"expected true or false (got {tied!r})")
    max_ctx, how = max_model_len(cfg, path, rope_scaling)
    mtp = 0
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if cfg.get(key) is not None:
            mtp = _int(cfg, key, path, allow_zero=True)
            break
    if max_ctx is None:  # nothing relies on it but the check of the sessions' length
        warn_input(path, "max_position_embeddings", "absent (and no rope_scaling gives a length): the check of "
                   "context + new tokens against the model's maximum length is off")
    return ModelSpec(
        name=str(cfg.get("model_type", family)), hidden=hidden, q_heads=q_heads, kv_heads=kv_heads,
        head_dim=head_dim, ffn=ffn, layers=layers, vocab=cfg["vocab_size"], tied_embeddings=tied,
        qk_norm=family in _QK_NORM and mla is None, moe_layers=moe_layers, linear_layers=linear_layers,
        moe=moe, mla=mla, linear=linear, attn_output_gate=bool(cfg.get("attn_output_gate", False)),
        max_context=max_ctx, max_context_source=how, mtp_layers=mtp,
    )


def read_hf_config(path: Path, rope_scaling: Optional[dict] = None) -> ModelSpec:
    """Read a HuggingFace ``config.json`` file into a :class:`ModelSpec`.

    Raises:
        InputError: see :func:`read_json` and :func:`parse_config`.
    """
    path = Path(path)
    return parse_config(read_json(path), path, rope_scaling)
