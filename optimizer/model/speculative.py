"""Speculative decoding in the one performance model: tokens per decode step, the step's cost and
memory, and the engines' launch flags.

A speculative decode step drafts ``k`` tokens per sequence, then the target model verifies them
in one pass and keeps the accepted prefix plus one token of its own (Leviathan et al. 2023, "Fast
Inference from Transformers via Speculative Decoding", sec. 2-3).

**Tokens per step.** ``acceptance`` ``a`` is the *per-token* acceptance rate: the probability
that a drafted token is accepted given that the ones before it were (Leviathan et al.'s ``α``,
assumed the same for every position). The expected tokens a step emits are (their eq. 1)::

    E[tokens per step] = (1 - a^(k+1)) / (1 - a)        (k + 1 at a = 1)

k = 1 at a = 0.8 gives 1.8. For MTP the DeepSeek-V3 technical report (sec. 5.4.3) measures 85-90 %
acceptance of the second token (k = 1: 1.85-1.9 tokens per step, "1.8 times TPS").

**Step time** (seconds, :class:`SpeculativeSteps`), with ``B`` running decodes:

* the verify step: the target with ``k + 1`` query tokens per sequence, i.e. its GEMMs and MoE
  routing see ``B·(k+1)`` tokens on the same weights read, while attention reads each
  sequence's KV once plus the ``k`` drafted positions (``draft_tokens`` of
  :func:`optimizer.model.prefill.mixed_step_s`; under the measured source the database's step at
  ``B·(k+1)`` decodes, :meth:`optimizer.model.measured.MeasuredSteps.mixed_step_s`);
* plus ``k`` sequential draft passes of ``B`` tokens each (the first one also carries the step's
  prefill chunk, whose KV the draft keeps as well), timed by the analytic roofline (eq. 6-2) of
  the draft module under every source (the measured database has no MTP or EAGLE module):

  - ``mtp``: the checkpoint's multi-token-prediction module (DeepSeek-V3 sec. 2.2: one decoder
    layer shaped like the model's last one, ``eh_proj`` ``2H x H`` joining the embedding and the
    previous hidden state, RMSNorms, and the embedding and output head shared with the main
    model); ``k`` passes reuse the ``num_nextn_predict_layers`` modules in turn, as vLLM does;
  - ``eagle``: a one-layer draft head (EAGLE, Li et al. 2024: one decoder layer plus the
    ``fc`` ``2H x H`` on the shared embedding and head): the target's last-layer shape, or
    ``draft_config`` (an EAGLE head's HF config) when given;
  - ``draft``: a separate draft model (``draft_config``, an HF config) with its own embedding
    and head.

  Every draft pass reads the LM head (the draft's next-token logits); a shared embedding/head is
  held once (vLLM ``load_eagle_model`` shares them when the draft checkpoint has none).

TPOT = step time / E[tokens per step]. The serving model uses it in every TPOT check and in
Little's law (a request needs ``(OSL - 1)/E`` steps).

**Memory.** The draft's weights (DeepSeek-V3: one MoE layer and ``eh_proj``, about 11.6 B
parameters; the checkpoint's "14 B MTP" also counts its own copies of the embedding and head,
2 x 0.93 B, which the engines share) and its KV cache (one layer per MTP/EAGLE module) are held
next to the target's; each request's KV also holds the ``k`` draft slots (``context + new + k``).

**Launch flags** (:func:`launch_flags`): vLLM ``--speculative-config`` JSON (``method``
``deepseek_mtp``/``qwen3_next_mtp``/``mtp``, ``eagle``, ``draft_model``; ``num_speculative_tokens``;
``model``: the draft), SGLang ``--speculative-algorithm NEXTN|EAGLE|STANDALONE`` with
``--speculative-num-steps k --speculative-eagle-topk 1 --speculative-num-draft-tokens k+1`` (a
chain of ``k`` drafts, which is what the formula above models; SGLang's tree drafting with top-k
> 1 is not modelled). Names as in vLLM ``vllm/config/speculative.py`` (``SpeculativeMethod``,
``MTPModelTypes``) and SGLang ``server_args.py`` (``--speculative-algorithm`` choices).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from optimizer.errors import InputError
from optimizer.model.config import ModelSpec, read_hf_config
from optimizer.model.layout import Layout
from optimizer.model.perf import PerfModel
from optimizer.model.prefill import PEAK, Efficiency, mixed_step_s, prefill_s
from optimizer.model.steptimes import ANALYTIC

METHODS = ("mtp", "eagle", "draft")
MAX_TOKENS = 16  # drafted tokens per step (engines default to 1-5; beyond 16 the formula is all tail)
DRAFT_MODEL_PLACEHOLDER = "DRAFT_MODEL"  # launch flags without speculative.draft_hf_id
# vLLM's MTP method name per target model_type (vllm/config/speculative.py MTPModelTypes; "mtp" is
# the generic name the others map to)
_VLLM_MTP = {"deepseek_v3": "deepseek_mtp", "deepseek_v2": "deepseek_mtp", "qwen3_next": "qwen3_next_mtp",
             "qwen3_5": "qwen3_5_mtp", "qwen3_5_moe": "qwen3_5_mtp"}


def expected_tokens_per_step(tokens: int, acceptance: float) -> float:
    """Expected tokens one speculative step emits with ``tokens`` = k drafted tokens at per-token
    acceptance ``a``: ``(1 - a^(k+1)) / (1 - a)``, ``k + 1`` at ``a = 1`` (Leviathan et al. 2023,
    eq. 1). 1 for ``k = 0`` (no speculation)."""
    k, a = int(tokens), float(acceptance)
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class Speculative:
    """A resolved ``speculative:`` block.

    Attributes:
        method: ``mtp``, ``eagle`` or ``draft``.
        tokens: k, tokens drafted per step.
        acceptance: per-token acceptance rate a in (0, 1] (see the module docstring).
        draft: the draft module's shape (MTP module, EAGLE head or draft model).
        draft_config: the draft's HF config file, or None (MTP; EAGLE shaped like the target).
        draft_hf_id: the draft's model name for launch commands, or None.
        model_type: the target's ``model_type`` (vLLM's MTP method name depends on it).
    """

    method: str
    tokens: int
    acceptance: float
    draft: Optional[ModelSpec] = None
    draft_config: Optional[str] = None
    draft_hf_id: Optional[str] = None
    model_type: str = ""

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens per decode step (:func:`expected_tokens_per_step`)."""
        return expected_tokens_per_step(self.tokens, self.acceptance)

    @property
    def shares_embeddings(self) -> bool:
        """The draft reads the target's embedding and head (MTP, EAGLE) rather than its own."""
        return self.method != "draft"

    def label(self) -> str:
        return (f"speculative {self.method} k={self.tokens} at acceptance {self.acceptance:g} "
                f"({self.tokens_per_step:.3g} tokens per step)")

    def as_dict(self) -> dict:
        return {"method": self.method, "tokens": self.tokens, "acceptance": self.acceptance,
                "tokens_per_step": self.tokens_per_step, "draft_config": self.draft_config,
                "draft_hf_id": self.draft_hf_id}


def module_spec(target: ModelSpec, what: str) -> ModelSpec:
    """One decoder layer shaped like ``target``'s last layer (its attention kind, MoE or dense
    FFN), with the target's hidden size and vocabulary: the MTP module (DeepSeek-V3 sec. 2.2) or a
    default EAGLE head. ``what`` labels it."""
    last = target.layers - 1
    return replace(target, name=f"{target.name} {what}", layers=1,
                   moe_layers=(0,) if last in target.moe_layers else (),
                   linear_layers=(0,) if last in target.linear_layers else (),
                   linear=target.linear if last in target.linear_layers else None, mtp_layers=0)


def resolve(method: Any, tokens: Any, acceptance: Any, target: ModelSpec, path: Path | None,
            where: str = "serving.speculative", draft_config: Optional[str] = None,
            draft_hf_id: Optional[str] = None, model_config: str = "model.config") -> Speculative:
    """Check a ``speculative:`` block and resolve its draft.

    Args:
        method, tokens, acceptance: the block's fields (see :class:`Speculative`).
        target: the served model; path: the instance file; where: the block's dotted field.
        draft_config: the draft's HF config (relative to the instance's folder); draft_hf_id: its name.
        model_config: the target config's field (for messages).
    Raises:
        InputError: one line naming the field: an unknown method, ``tokens`` not an integer in
            1..16, ``acceptance`` outside (0, 1], ``mtp`` on a model without MTP layers,
            ``draft`` without ``draft_config``, a draft whose vocabulary differs from the target's.
    """
    if method not in METHODS:
        raise InputError(path, f"{where}.method", f"unknown method {method!r} (one of {', '.join(METHODS)})")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_TOKENS:
        raise InputError(path, f"{where}.tokens", f"must be an integer from 1 to {MAX_TOKENS}: the tokens drafted "
                                                  f"per step (got {tokens!r})")
    if (isinstance(acceptance, bool) or not isinstance(acceptance, (int, float)) or not math.isfinite(acceptance)
            or not 0 < acceptance <= 1):
        raise InputError(path, f"{where}.acceptance", f"must be in (0, 1]: the per-token probability that a drafted "
                                                      f"token is accepted (got {acceptance!r})")
    if method == "mtp":
        if draft_config is not None:
            raise InputError(path, f"{where}.draft_config", "applies to eagle and draft; mtp uses the checkpoint's "
                                                            "own multi-token-prediction layers")
        if target.mtp_layers < 1:
            raise InputError(path, f"{where}.method", f"mtp needs multi-token-prediction layers and {model_config} "
                                                      f"({target.name}) has none (num_nextn_predict_layers / "
                                                      f"mtp_num_hidden_layers absent or 0): use eagle or draft")
        draft = module_spec(target, "MTP module")
    elif draft_config is None:
        if method == "draft":
            raise InputError(path, f"{where}.draft_config", "method draft needs the draft model's HF config.json")
        draft = module_spec(target, "EAGLE head")
    else:
        f = Path(draft_config)
        f = f if f.is_absolute() or path is None else Path(path).parent / f
        from optimizer.schema_base import existing_file

        existing_file(path, f"{where}.draft_config", f, "draft model config")
        draft = read_hf_config(f)
        if draft.vocab != target.vocab:
            raise InputError(path, f"{where}.draft_config", f"the draft's vocab_size {draft.vocab} differs from the "
                                                            f"target's {target.vocab} (the draft must share its tokenizer)")
        if method == "eagle" and draft.hidden != target.hidden:
            raise InputError(path, f"{where}.draft_config", f"an EAGLE head works on the target's hidden states: "
                                                            f"hidden_size {draft.hidden} differs from {target.hidden}")
    return Speculative(method, int(tokens), float(acceptance), draft, draft_config, draft_hf_id, target.name)


def draft_perf(target: PerfModel, sp: Speculative) -> PerfModel:
    """The draft module's :class:`PerfModel` on the target's hardware and dtypes: MTP and EAGLE
    add the ``2H x H`` projection (``head_params``) and share the target's embedding and head."""
    d = sp.draft
    head = 2.0 * d.hidden * d.hidden if sp.method in ("mtp", "eagle") else 0.0  # eh_proj / EAGLE fc
    return PerfModel(d, target.hw, target.w.weight_bytes, target.w.kv_bytes, 0.0, weight_dtype=target.weight_dtype,
                     kv_dtype=target.kv_dtype, comm_overlap=target.comm_overlap, head_params=head,
                     shared_embeddings=sp.shares_embeddings)


def _draft_layout(lay: Layout) -> Layout:
    """The draft runs on the worker's GPUs with its layout, in one stage and without CP."""
    return replace(lay, pp=1, cp=1)


@dataclass(frozen=True)
class SpeculativeSteps:
    """A step-time source with speculative decoding (see the module docstring): decode steps are
    verify steps of the base source plus the draft's passes; prefill adds the draft's pass over
    the prompt; memory holds the draft's weights and KV and ``k`` more KV slots per request.
    Every other attribute is the base source's."""

    base: Any
    spec: Speculative
    target: PerfModel
    draft: PerfModel
    eff: Efficiency = PEAK

    def __getattr__(self, item):
        if item in ("base", "spec", "target", "draft", "eff", "__setstate__"):
            raise AttributeError(item)
        return getattr(self.base, item)

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def why(self) -> str:
        return f"{self.base.why}; {self.spec.label()}, draft passes by the analytic roofline"

    @property
    def tokens_per_step(self) -> float:
        return self.spec.tokens_per_step

    def draft_s(self, lay: Layout, chunk: float, context_before: float, batch: float, decode_context: float,
                chunk_ranks: int = 1) -> float:
        """The draft's passes of one step (s): pass 1 carries the chunk and the ``batch`` decodes,
        passes 2..k the decodes alone, pass j at context ``decode_context + j - 1``."""
        if batch <= 0 and chunk <= 0:
            return 0.0
        dl = _draft_layout(lay)
        t = mixed_step_s(self.draft, dl, chunk, context_before, batch, decode_context, self.eff, chunk_ranks)
        if batch > 0:
            t += sum(mixed_step_s(self.draft, dl, 0.0, 0.0, batch, decode_context + j, self.eff)
                     for j in range(1, self.spec.tokens))
        return t

    def mixed_step_s(self, lay, chunk, context_before, batch, decode_context, chunk_ranks=1, draft_tokens=None):
        """Verify step (``k`` draft tokens per decode) plus the draft passes; ``draft_tokens`` is
        ignored (the block's ``tokens`` apply)."""
        k = self.spec.tokens if batch > 0 else 0
        verify = self.base.mixed_step_s(lay, chunk, context_before, batch, decode_context, chunk_ranks, k)
        return verify + self.draft_s(lay, chunk, context_before, batch, decode_context, chunk_ranks)

    def prefill_s(self, lay, prompt_tokens, prompts_per_rank=1):
        """The base prefill plus the draft's pass over the prompt (its KV cache is filled too)."""
        return (self.base.prefill_s(lay, prompt_tokens, prompts_per_rank)
                + prefill_s(self.draft, _draft_layout(lay), prompt_tokens, self.eff, prompts_per_rank))

    def draft_static_bytes_per_gpu(self, lay: Layout) -> float:
        """The draft's weights per GPU of the worker (bytes; shared embedding/head not counted)."""
        return self.draft.weight_bytes_per_gpu(_draft_layout(lay))

    def max_sessions(self, lay, context, new):
        """Requests of ``context + new`` tokens that fit with the draft next to the target.

        Analytic (eq. 6-1): per stage ``(memory - static - draft weights) // (KV(context+new+k) +
        draft KV(context+new))``, the draft on the last stage. Measured: the base source's KV
        token capacity less the draft's weights in KV tokens, each request taking ``context + new
        + k`` tokens plus its draft KV in target-KV tokens."""
        k = self.spec.tokens
        tp = self.target
        dl = _draft_layout(lay)
        draft_w = self.draft_static_bytes_per_gpu(lay)
        draft_kv = self.draft.kv_bytes_per_gpu(dl, context, new)
        if self.base.name in ANALYTIC:
            best = None
            stages = tp.stages(lay.pp)
            for i, st in enumerate(stages):
                last = i == len(stages) - 1
                room = tp.hw.gpu.memory_bytes - tp._static(st, lay) - (draft_w if last else 0.0)
                if room < 0:
                    return 0
                kv = tp._kv_session(st, lay, context + new + k) + (draft_kv if last else 0.0)
                n = int(room // kv) if kv > 0 else 10 ** 9
                best = n if best is None else min(best, n)
            return best * lay.attention_dp
        per_token = tp.kv_bytes_per_gpu(lay, 1, 0)
        dp = lay.attention_dp
        tokens_per_rank = self.base.max_sessions(lay, 1, 0) / dp - draft_w / per_token
        per_request = context + new + k + draft_kv / per_token
        return max(0, int(tokens_per_rank // per_request)) * dp


def speculative_steps(base: Any, sp: Optional[Speculative], target: PerfModel, eff: Efficiency = PEAK):
    """``base`` with speculative decoding (:class:`SpeculativeSteps`), or ``base`` when ``sp`` is None."""
    if sp is None:
        return base
    return SpeculativeSteps(base, sp, target, draft_perf(target, sp), eff)


def launch_flags(spec: Speculative, engine: str) -> list[str]:
    """The engine's command-line arguments for ``spec`` (argv items, unquoted).

    vLLM: ``--speculative-config`` with JSON ``{"method", "num_speculative_tokens"[, "model"]}``
    (``method``: ``deepseek_mtp`` for DeepSeek-V2/V3, ``qwen3_next_mtp``/``qwen3_5_mtp`` for those,
    else ``mtp``; ``eagle``; ``draft_model``). SGLang: ``--speculative-algorithm`` ``NEXTN`` /
    ``EAGLE`` / ``STANDALONE`` (with ``--speculative-draft-model-path`` for the last two),
    ``--speculative-num-steps k --speculative-eagle-topk 1 --speculative-num-draft-tokens k+1``.

    Raises:
        ValueError: an engine other than ``vllm`` or ``sglang``.
    """
    k = spec.tokens
    draft = spec.draft_hf_id or DRAFT_MODEL_PLACEHOLDER
    if engine == "vllm":
        cfg: dict = {"method": {"mtp": _VLLM_MTP.get(spec.model_type, "mtp"), "eagle": "eagle",
                                "draft": "draft_model"}[spec.method]}
        if spec.method != "mtp":
            cfg["model"] = draft
        cfg["num_speculative_tokens"] = k
        return ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
    if engine == "sglang":
        algo = {"mtp": "NEXTN", "eagle": "EAGLE", "draft": "STANDALONE"}[spec.method]
        out = ["--speculative-algorithm", algo]
        if spec.method != "mtp":
            out += ["--speculative-draft-model-path", draft]
        return out + ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                      "--speculative-num-draft-tokens", str(k + 1)]
    raise ValueError(f"no speculative launch flags for engine {engine!r} (vllm or sglang)")
