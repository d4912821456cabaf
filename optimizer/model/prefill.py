"""Prefill and mixed (chunked-prefill + decode) forward passes on the shared performance model.

One forward pass of a worker processes, per attention-DP rank ``r``: ``tokens_r`` new tokens,
which read ``kv_tokens_r`` tokens of KV (the KV they attend to: written and read once) and
attend over ``attn_tokens_r`` (query, key) pairs in total. The three cases:

* a decode batch of sessions at positions ``s_i``: ``tokens = n``, ``kv = attn = Σ(s_i+1)``
  (exactly :meth:`optimizer.model.perf.PerfModel.step`);
* a prompt chunk of ``c`` tokens after ``c0`` tokens already in the KV cache (chunked prefill;
  ``c0 = 0`` for a whole prompt): ``tokens = c``, ``kv = c0 + c`` (the chunk's KV is written and
  the earlier KV read once, FlashAttention-style), ``attn = Σ_{i=1..c}(c0+i) = c·c0 + c(c+1)/2``
  (the causal ``n²`` term of prompt FLOP, reference chapter eq. 6-5 summed over positions);
* a mixed step: the sum of a chunk and a decode batch on the same weights read (vLLM/SGLang
  continuous batching with chunked prefill).

Per stage the time comes from the same per-stage roofline as decode
(:meth:`optimizer.model.perf.PerfModel.stage_step`, eq. 6-2: ``max(bytes / B_HBM, FLOP / P)``
plus the TP AllReduces and EP All-to-Alls of all the pass's tokens), so prefill, decode and
mixed steps share one code path; the attention FLOP per KV token read is scaled to
``attn/kv`` per rank. Optional efficiencies divide the memory, compute and network parts.
A linear-attention (hybrid) layer's state is counted as read and written once per token, as in
decode (an over-estimate for chunked prefill, which updates it once per chunk).
Units: tokens, seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from optimizer.model.layout import Layout
from optimizer.model.perf import PerfModel
from optimizer.model.weights import ACTIVATION_BYTES


@dataclass(frozen=True)
class Efficiency:
    """Achieved share of peak: ``compute`` (FLOP/s), ``memory`` (HBM bytes/s), ``network``
    (collectives). 1.0 each (peak, as the reference chapter) unless measured."""

    compute: float = 1.0
    memory: float = 1.0
    network: float = 1.0


PEAK = Efficiency()


@dataclass(frozen=True)
class PassBreakdown:
    """One forward pass (s): ``total_s`` and its parts summed over stages (busiest rank)."""

    total_s: float
    local_s: float
    compute_s: float
    comm_s: float


def forward_pass(perf: PerfModel, lay: Layout, tokens, kv_tokens, attn_tokens,
                 eff: Efficiency = PEAK) -> PassBreakdown:
    """Time of one forward pass (see the module docstring).

    Args:
        perf: the shared model (model, dtype, hardware).
        lay: the layout.
        tokens, kv_tokens, attn_tokens: per attention-DP rank, shape [attention_dp] (a scalar is
            put on rank 0, the other ranks idle but running every layer, as in :meth:`PerfModel.step`).
        eff: efficiencies dividing the HBM, compute and communication parts.
    Returns:
        :class:`PassBreakdown` of the busiest rank per stage, stages summed with the PP hand-offs
        (``α + tokens·H·2/B``, one micro-batch).
    """
    dp = lay.attention_dp
    b = _per_rank(tokens, dp)
    kv = _per_rank(kv_tokens, dp)
    at = _per_rank(attn_tokens, dp)
    ratio = np.divide(at, kv, out=np.zeros_like(at), where=kv > 0)
    b_total = float(b.sum())
    total = local = compute = comm = 0.0
    stages = perf.stages(lay.pp)
    for k, st in enumerate(stages):
        st_r = replace(st, attn_flops_ctx=st.attn_flops_ctx * ratio)
        _, lo, co, ar, a2a, *_ = perf.stage_step(st_r, lay, b, kv, b_total, None)
        lo, co = np.broadcast_to(lo, b.shape), np.broadcast_to(co, b.shape)
        t = np.maximum(lo / eff.memory, co / eff.compute) + (ar + a2a) / eff.network
        r = int(np.argmax(t))
        hand = perf.hw.p2p_s(b_total * perf.spec.hidden * ACTIVATION_BYTES, perf.crosses_servers(lay, k)) / eff.network \
            if k < len(stages) - 1 else 0.0
        total += float(t[r]) + hand
        local += float(lo[r]) / eff.memory
        compute += float(co[r]) / eff.compute
        comm += (ar + a2a) / eff.network + hand
    return PassBreakdown(total, local, compute, comm)


def _per_rank(x, dp: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        out = np.zeros(dp)
        out[0] = float(a)
        return out
    if a.shape != (dp,):
        raise ValueError(f"per-rank figures must have shape [{dp}] (got {a.shape})")
    return a


def chunk_attention_pairs(chunk: float, context_before: float) -> float:
    """Causal (query, key) pairs of a chunk of ``chunk`` tokens after ``context_before`` tokens:
    ``Σ_{i=1..c}(c0+i) = c·c0 + c(c+1)/2``."""
    return chunk * context_before + chunk * (chunk + 1) / 2.0


def prefill_s(perf: PerfModel, lay: Layout, prompt_tokens: int, eff: Efficiency = PEAK, prompts_per_rank: int = 1) -> float:
    """Time (s) to prefill prompts of ``prompt_tokens`` tokens in one pass, ``prompts_per_rank``
    on every attention-DP rank (1 prompt on a rank of a TP-only layout).

    Prompt FLOP = ``2·active params·n + attention FLOP per pair·n(n+1)/2`` (eqs. 6-4/6-5 summed over
    the prompt's positions: the ``n²`` term); bytes = weights + the prompt's KV written once.
    Compute bound for long prompts (eq. 6-2)."""
    n = float(prompt_tokens)
    q = float(prompts_per_rank)
    dp = lay.attention_dp
    return forward_pass(perf, lay, np.full(dp, q * n), np.full(dp, q * n),
                        np.full(dp, q * chunk_attention_pairs(n, 0.0)), eff).total_s


def mixed_step_s(perf: PerfModel, lay: Layout, chunk: float, context_before: float, batch: float,
                 decode_context: float, eff: Efficiency = PEAK, chunk_ranks: int = 1) -> float:
    """One continuous-batching step (s): a prefill chunk of ``chunk`` tokens (after
    ``context_before`` tokens of its prompt) on each of the first ``chunk_ranks`` attention-DP ranks,
    plus ``batch`` running decodes spread evenly over the ranks, each reading ``decode_context``
    tokens of KV (its position + 1). ``chunk = 0`` is a plain decode step (equal to
    :meth:`PerfModel.step` with ``batch`` sessions at that context); ``batch = 0`` a plain chunk."""
    dp = lay.attention_dp
    per = batch / dp
    tokens = np.full(dp, per)
    kv = np.full(dp, per * decode_context)
    attn = kv.copy()
    if chunk > 0:
        r = slice(0, max(1, min(chunk_ranks, dp)))
        tokens[r] += chunk
        kv[r] += context_before + chunk
        attn[r] += chunk_attention_pairs(chunk, context_before)
    return forward_pass(perf, lay, tokens, kv, attn, eff).total_s


def kv_bytes_per_request(perf: PerfModel, tokens: int) -> float:
    """KV (and linear-attention state) bytes of one request of ``tokens`` tokens for the whole model,
    bytes: ``kv_bytes_per_token·tokens + state`` (GQA ``2·L·KVH·D·b``; MLA the latent and RoPE key
    ``(kv_lora_rank + qk_rope_head_dim)·L·b``; hybrid models only their full-attention layers).
    This is what a disaggregated prefill worker sends to the decode worker."""
    return perf.w.kv_bytes_per_token * tokens + perf.w.state_bytes_per_session


def kv_transfer_s(kv_bytes: float, senders: int, bandwidth_bytes_per_s: float, latency_s: float,
                  prefill_s_: float = 0.0, layers: int = 1, mode: str = "request") -> float:
    """Time the KV transfer adds to TTFT after the prefill (s), over ``senders`` links (one NIC per
    GPU of the prefill worker) of ``bandwidth_bytes_per_s`` each.

    ``request``: the whole KV is sent after the prefill: ``α + bytes/(g·B)``.
    ``layerwise``: layer ``l``'s KV leaves when layer ``l`` is done (prefill ``T_p``, transfer
    ``T_x = bytes/(g·B)``, ``L`` layers, sends one after another): the last byte arrives at
    ``max(T_p + T_x/L, T_p/L + T_x)``, so the transfer adds ``α + max(T_x/L, T_x - T_p·(L-1)/L)``.
    """
    tx = kv_bytes / (senders * bandwidth_bytes_per_s)
    if mode == "request":
        return latency_s + tx
    if mode == "layerwise":
        return latency_s + max(tx / layers, tx - prefill_s_ * (layers - 1) / layers)
    raise ValueError(f"kv transfer mode {mode!r} is not request or layerwise")
