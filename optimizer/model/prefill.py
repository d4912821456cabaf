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

A context-parallel layout (``cp > 1``, chapter 6.2.4) prefills a prompt with :func:`prefill_terms`:
each CP rank's pass of its ``n/cp`` zig-zag tokens on its own TP group plus the K/V exchange not
hidden by compute (:mod:`optimizer.model.sequence`). The communication overlap fraction of the
model (:attr:`PerfModel.comm_overlap`, chapter 6.4.3) applies here as in decode; two-batch
overlap (:attr:`PerfModel.micro_batches`) only to decode steps (:func:`forward_pass` ``decode``).
Units: tokens, seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from optimizer.model.layout import Layout
from optimizer.model.perf import PerfModel
from optimizer.model.sequence import causal_pairs_contiguous, causal_pairs_zigzag, kv_exchange_layer_s, zigzag_tokens
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
                 eff: Efficiency = PEAK, decode: bool = False) -> PassBreakdown:
    """Time of one forward pass (see the module docstring).

    Args:
        perf: the shared model (model, dtype, hardware).
        lay: the layout.
        tokens, kv_tokens, attn_tokens: per attention-DP rank, shape [attention_dp] (a scalar is
            put on rank 0, the other ranks idle but running every layer, as in :meth:`PerfModel.step`).
        eff: efficiencies dividing the HBM, compute and communication parts.
        decode: the pass is a decode step (no prompt tokens): under the model's
            ``micro_batches=2`` it is timed as two micro-batches
            (:meth:`~optimizer.model.perf.PerfModel.microbatch_terms`, each part divided by its
            efficiency before the overlap); prefill passes and mixed steps are one batch.
    Returns:
        :class:`PassBreakdown` of the busiest rank per stage, stages summed with the PP hand-offs
        (``α + tokens·H·2/B``, one micro-batch).
    Raises:
        ValueError: a context-parallel layout (``cp > 1``: time it with :func:`prefill_terms`).
    """
    if lay.cp != 1:
        raise ValueError(f"{lay.label()}: a context-parallel pass is timed by prefill_terms, not forward_pass")
    dp = lay.attention_dp
    phi = perf.comm_overlap
    b = _per_rank(tokens, dp)
    kv = _per_rank(kv_tokens, dp)
    at = _per_rank(attn_tokens, dp)
    ratio = np.divide(at, kv, out=np.zeros_like(at), where=kv > 0)
    b_total = float(b.sum())
    total = local = compute = comm = 0.0
    stages = perf.stages(lay.pp)
    for k, st in enumerate(stages):
        mbt = perf.microbatch_terms(st, lay, b, kv, b_total, None, ratio) if decode else None
        if mbt is not None:  # two micro-batches: the halves' sums are the parts, the overlap the time
            parts = mbt.overlapped + (mbt.serial or ())
            lo = sum(np.broadcast_to(x.local, b.shape) for x in parts)
            co = sum(np.broadcast_to(x.compute, b.shape) for x in parts)
            ar, a2a = sum(float(x.allreduce) for x in parts), sum(float(x.alltoall) for x in parts)
            t = perf.microbatch_time(mbt, eff.memory, eff.compute, eff.network)
        else:
            st_r = replace(st, attn_flops_ctx=st.attn_flops_ctx * ratio)
            _, lo, co, ar, a2a, *_ = perf.stage_terms(st_r, lay, b, kv, b_total, None)
            lo, co = np.broadcast_to(lo, b.shape), np.broadcast_to(co, b.shape)
            if phi:  # chapter 6.4.3: the overlapped share of the collectives runs under the compute
                cm = (ar + a2a) / eff.network
                t = np.maximum(np.maximum(lo / eff.memory, co / eff.compute), phi * cm) + (1.0 - phi) * cm
            else:
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


@dataclass(frozen=True)
class PrefillTerms:
    """The terms of one prompt's prefill (s unless named), busiest rank, stages summed.

    Attributes:
        layout: the layout's label; prompt_tokens: n; cp: CP ranks.
        tokens_per_rank: prompt tokens on the busiest CP rank (zig-zag; ``n`` for cp = 1).
        pairs_per_rank: causal (query, key) pairs of the busiest rank, zig-zag (``n(n+1)/2`` for cp = 1).
        pairs_contiguous_max: the busiest rank's pairs had the split been contiguous (the imbalance
            zig-zag removes).
        gemm_s: weight-matrix compute of the rank's tokens; attention_s: its attention compute;
        local_s: HBM time (weights, KV); allreduce_s: TP AllReduces / All-to-Alls and PP hand-offs;
        kv_exchange_s: the K/V exchange's own time; kv_exposed_s: the part of it not hidden by compute;
        total_s: the prefill time (TTFT without queueing or KV transfer).
    """

    layout: str
    prompt_tokens: int
    cp: int
    tokens_per_rank: float
    pairs_per_rank: float
    pairs_contiguous_max: float
    gemm_s: float
    attention_s: float
    local_s: float
    allreduce_s: float
    kv_exchange_s: float
    kv_exposed_s: float
    total_s: float

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def prefill_terms(perf: PerfModel, lay: Layout, prompt_tokens: int, eff: Efficiency = PEAK,
                  prompts_per_rank: int = 1, ring_overlap: float = 1.0) -> PrefillTerms:
    """One prompt's prefill with its terms (:class:`PrefillTerms`), any layout.

    ``cp = 1``: the pass of :func:`prefill_s` (``total_s`` equal to it). ``cp = c > 1`` (chapter
    6.2.4, Ring Attention (Liu et al. 2023), zig-zag balance (Yang et al. 2024)): each CP rank is
    one TP x DP group holding the TP-split weights; its pass (:func:`forward_pass` on that group)
    has the busiest rank's zig-zag tokens ``n/c``, reads every K/V block once (``kv = n``) and
    attends over its zig-zag pairs ``n(n+1)/2c``; per full-attention layer the K/V exchange of
    blocks ``(n/c)·kv_bytes_per_token_layer/min(TP, KVH)`` bytes per GPU is timed by
    :func:`~optimizer.model.sequence.kv_exchange_layer_s` under the model's ``cp_kv_exchange``
    (``ring``: overlapped with the block's attention, ``ring_overlap`` the share; ``allgather``:
    not hidden), on the tier of the worker's ``cp x TP x DP`` GPUs. ``total = pass + exposed``;
    under the model's ``cp_ffn: worker`` plus, per dense-FFN layer, the all-gather + reduce-scatter of
    the whole prompt over the worker's GPUs less the rank's own FFN AllReduce (in ``allreduce_s``).

    Raises:
        ValueError: ``prompt_tokens < 2·cp`` (the zig-zag split needs two chunks per rank).
    """
    n = int(prompt_tokens)
    c = lay.cp
    q = float(prompts_per_rank)
    if c > 1 and n < 2 * c:
        raise ValueError(f"a prompt of {n} tokens cannot be split zig-zag over CP{c} (needs at least {2 * c})")
    rank = replace(lay, cp=1)
    dp = lay.attention_dp
    if c > 1:
        zig = causal_pairs_zigzag(n, c)
        r = int(np.argmax(zig))
        pairs, toks = float(zig[r]), float(zigzag_tokens(n, c)[r])
        contiguous = float(causal_pairs_contiguous(n, c).max())
    else:
        pairs = contiguous = chunk_attention_pairs(float(n), 0.0)
        toks = float(n)
    br = forward_pass(perf, rank, np.full(dp, q * toks), np.full(dp, q * float(n)), np.full(dp, q * pairs), eff)
    w = perf.w
    attn_layer_s = w.attention_flops_per_context_token_layer * q * pairs / lay.attention_tp \
        / perf.attention_peak_flops / eff.compute  # [layers]
    attention_s = float(attn_layer_s.sum())
    exchange = exposed = 0.0
    if c > 1:
        link = perf.hw.link(lay.gpus_per_stage)
        blocks = w.kv_bytes_per_token_layer * q * (n / c) / perf.kv_shards(lay)
        for blk, t_attn in zip(blocks, attn_layer_s):
            if blk <= 0:  # a linear-attention layer keeps a state, not K/V
                continue
            tot, exp = kv_exchange_layer_s(perf.cp_kv_exchange, c, float(blk), float(t_attn) * eff.network,
                                           link.alpha_s, link.bandwidth_bytes_per_s, ring_overlap)
            tot, exp = tot / eff.network, exp / eff.network  # the network efficiency divides it, as every collective
            exchange += tot
            exposed += exp
    ffn_extra = 0.0
    if c > 1 and perf.cp_ffn == "worker":  # the dense FFN over all the worker's GPUs (SGLang 0.5.14)
        from optimizer.model.sequence import sp_collective_s

        hw, row = perf.hw, perf.spec.hidden * ACTIVATION_BYTES
        ffn_layers = sum(st.dense_ffn_layers for st in perf.stages(lay.pp))
        whole = sp_collective_s(hw, lay.gpus_per_stage, q * n * row)
        own = hw.allreduce_s(lay.attention_tp, q * toks * row)
        ffn_extra = ffn_layers * (whole - own) / eff.network
    return PrefillTerms(lay.label(), n, c, toks, pairs, contiguous, br.compute_s - attention_s, attention_s,
                        br.local_s, br.comm_s + ffn_extra, exchange, exposed, br.total_s + exposed + ffn_extra)


def prefill_s(perf: PerfModel, lay: Layout, prompt_tokens: int, eff: Efficiency = PEAK, prompts_per_rank: int = 1) -> float:
    """Time (s) to prefill prompts of ``prompt_tokens`` tokens in one pass, ``prompts_per_rank``
    on every attention-DP rank (1 prompt on a rank of a TP-only layout).

    Prompt FLOP = ``2·active params·n + attention FLOP per pair·n(n+1)/2`` (eqs. 6-4/6-5 summed over
    the prompt's positions: the ``n²`` term); bytes = weights + the prompt's KV written once.
    Compute bound for long prompts (eq. 6-2). A context-parallel layout: :func:`prefill_terms`."""
    if lay.cp != 1:
        return prefill_terms(perf, lay, prompt_tokens, eff, prompts_per_rank).total_s
    n = float(prompt_tokens)
    q = float(prompts_per_rank)
    dp = lay.attention_dp
    return forward_pass(perf, lay, np.full(dp, q * n), np.full(dp, q * n),
                        np.full(dp, q * chunk_attention_pairs(n, 0.0)), eff).total_s


def mixed_step_s(perf: PerfModel, lay: Layout, chunk: float, context_before: float, batch: float,
                 decode_context: float, eff: Efficiency = PEAK, chunk_ranks: int = 1, draft_tokens: int = 0) -> float:
    """One continuous-batching step (s): a prefill chunk of ``chunk`` tokens (after
    ``context_before`` tokens of its prompt) on each of the first ``chunk_ranks`` attention-DP ranks,
    plus ``batch`` running decodes spread evenly over the ranks, each reading ``decode_context``
    tokens of KV (its position + 1). ``chunk = 0`` is a plain decode step (equal to
    :meth:`PerfModel.step` with ``batch`` sessions at that context); ``batch = 0`` a plain chunk.

    A plain decode step (``chunk = 0``) is timed as two micro-batches under the model's
    ``micro_batches=2`` (:func:`forward_pass` ``decode``); a step with a chunk is one batch.

    ``draft_tokens = k > 0``: each decode is a speculative verify step (Leviathan et al. 2023,
    sec. 3: the target scores the ``k`` drafted tokens and the next one in one pass): ``k + 1``
    query tokens per sequence, so the GEMMs (and MoE routing, eq. 6-8) see ``batch·(k+1)`` tokens
    on the same weights read, while the attention reads each sequence's KV once plus the ``k``
    drafted positions (``decode_context + k`` tokens) and attends over
    ``Σ_{j=0..k}(decode_context + j) = (k+1)·decode_context + k(k+1)/2`` (query, key) pairs.
    The draft's own passes are not in this step (:class:`optimizer.model.speculative.SpeculativeSteps`).

    Raises:
        ValueError: a context-parallel layout (chunked prefill and decode on CP ranks are not modelled)."""
    if lay.cp != 1:
        raise ValueError(f"{lay.label()}: chunked prefill and decode on context-parallel ranks are not modelled "
                         "(CP is modelled for whole-prompt prefill)")
    dp = lay.attention_dp
    per = batch / dp
    k = int(draft_tokens)
    tokens = np.full(dp, per * (k + 1))
    kv = np.full(dp, per * (decode_context + k))
    attn = np.full(dp, per * ((k + 1) * decode_context + k * (k + 1) / 2.0))
    if chunk > 0:
        r = slice(0, max(1, min(chunk_ranks, dp)))
        tokens[r] += chunk
        kv[r] += context_before + chunk
        attn[r] += chunk_attention_pairs(chunk, context_before)
    return forward_pass(perf, lay, tokens, kv, attn, eff, decode=chunk <= 0).total_s


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
