"""Context parallelism, sequence parallelism and compute/communication overlap in the shared model.

Reference chapter 6.2.3 (sequence parallelism), 6.2.4 (context parallelism) and 6.4.3 (overlap);
papers where the chapter gives no formula: Ring Attention (Liu et al. 2023, "Ring Attention with
Blockwise Transformers for Near-Infinite Context"), Megatron-LM sequence parallelism (Korthikanti
et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"), context-parallel
inference with pass-KV rings and load-balanced sharding (Yang et al. 2024, "Context Parallelism
for Scalable Million-Token Inference").

**Causal balance (6.2.4).** A causal prompt of ``n`` positions has ``n(n+1)/2`` (query, key)
pairs: position ``i`` (1-based) attends to ``i`` keys. Split contiguously over ``c`` ranks the
last rank has the most (8 positions, 2 ranks: 10 vs 26 pairs, 2.6x). The zig-zag split cuts the
prompt into ``2c`` equal chunks and gives rank ``r`` chunks ``r`` and ``2c-1-r``: with chunk
size ``s = n/2c`` every rank has ``s²(2c-1) + s(s+1)`` pairs, i.e. ``n(n+1)/2 / c`` (8 positions:
ranks {1,2,7,8} and {3,4,5,6}, 18 each). :func:`causal_pairs_contiguous`, :func:`causal_pairs_zigzag`.

**CP prefill (TTFT).** With CP ``c`` each rank runs the GEMMs of its ``n/c`` tokens on its own
TP group (the same TP-split weights on every rank) and the attention of its queries against all
K/V (the busiest rank's zig-zag pairs); per full-attention layer it needs the other ranks' K/V
blocks of ``n/c`` tokens, ``blk = (n/c)·kv_bytes_per_token_layer/min(TP, KVH)`` bytes per GPU:

* ``ring`` (pass-KV, Ring Attention): ``c-1`` steps; in each, a rank sends the block it holds to
  its neighbour while computing attention against it, so a step takes
  ``max(t_blk, φ·t_send) + (1-φ)·t_send`` with ``t_send = α + blk/B`` and ``t_blk`` the layer's
  attention time ``/c`` (:func:`overlapped_s`, ``φ`` the ring's overlap fraction, 1 by default:
  the ring is built to hide the transfer). Exposed per layer: ``(c-1)·(step - t_blk)``. Each rank
  keeps only its own KV (memory per GPU ``KV/c``).
* ``allgather``: the blocks are gathered before the layer's attention, ``(c-1)·(α + blk/B)`` per
  layer, not hidden; every rank keeps the whole KV (what SGLang 0.5.14's dense prefill CP does,
  ``cp_strategy.materialize_full_kv``).

``TTFT = prefill of n/c tokens per rank (GEMMs, attention over its pairs, TP AllReduces of n/c
tokens, eq. 6-2) + the exposed exchange`` (:func:`optimizer.model.prefill.prefill_terms`). When the
dense FFN runs over all ``g = c·TP`` GPUs of the worker (``cp_ffn: worker``, SGLang 0.5.14), each
dense-FFN layer's TP AllReduce of ``n/c`` tokens over TP is replaced by an all-gather +
reduce-scatter of the whole prompt's ``n·H·2`` bytes over ``g`` GPUs (:func:`sp_collective_s`).

**Decode merge (6.2.4).** Decode on CP ranks splits a session's KV; each rank computes a partial
attention and the ranks merge the per-rank (max, sum, weighted value vector): an all-gather of
``batch·(QH/TP)·(D+2)`` FP32 values per layer (:func:`cp_decode_merge_s`).

**Sequence parallelism (6.2.3).** Inside a TP group of ``p`` GPUs the activations around
LayerNorm and dropout are split along the sequence: a ``[n, H]`` activation of ``n·H·b`` bytes is
``n·H·b/p`` per GPU instead of ``n·H·b`` on every GPU (``[8192, 4096]`` BF16: 64 MiB; 4 GPUs,
16 MiB each, 64 MiB in all instead of 256 MiB; :func:`sequence_activation_bytes`); each AllReduce
becomes a ReduceScatter + AllGather at the operator boundaries, on a ring
``2·(p-1)·(α + M/(p·B))``, the ring AllReduce's time (eq. 6-9; :func:`sp_collective_s`).

**Overlap (6.4.3).** A stated share ``φ`` of a communication time ``C`` runs under the compute
``W`` it overlaps: ``max(W, φ·C) + (1-φ)·C`` (``φ = 0``: the sum; ``φ = 1``: ``max(W, C)``).

Units: tokens, bytes, seconds.
"""
from __future__ import annotations

import math

import numpy as np

CP_KV_EXCHANGES = ("ring", "allgather")
CP_FFNS = ("rank", "worker")
FP32_BYTES = 4.0


def _choice(field: str, mode: str, allowed: tuple[str, ...]) -> str:
    if mode not in allowed:
        raise ValueError(f"{field} must be one of {', '.join(allowed)} (got {mode!r})")
    return mode


def check_cp_kv_exchange(mode: str) -> str:
    """``mode`` if it is ``ring`` or ``allgather``.

    Raises:
        ValueError: any other value.
    """
    return _choice("cp_kv_exchange", mode, CP_KV_EXCHANGES)


def check_cp_ffn(mode: str) -> str:
    """``mode`` if it is ``rank`` or ``worker`` (where a CP layout's dense FFN is split, see
    :class:`~optimizer.model.perf.PerfModel`).

    Raises:
        ValueError: any other value.
    """
    return _choice("cp_ffn", mode, CP_FFNS)


def check_overlap(phi: float) -> float:
    """``phi`` as a float if it is a number in [0, 1].

    Raises:
        ValueError: not a finite number in [0, 1].
    """
    if isinstance(phi, bool) or not isinstance(phi, (int, float)) or not (0.0 <= float(phi) <= 1.0):
        raise ValueError(f"an overlap fraction must be a number in [0, 1] (got {phi!r})")
    return float(phi)


def overlapped_s(work_s, comm_s, phi: float):
    """Time of ``work_s`` with ``comm_s`` of which the share ``phi`` overlaps it (chapter 6.4.3):
    ``max(W, φ·C) + (1-φ)·C``. Scalars or arrays of one shape; seconds."""
    return np.maximum(work_s, phi * comm_s) + (1.0 - phi) * comm_s


def _pairs_between(a, b):
    """Causal pairs of positions a+1..b (1-based): ``Σ i = (b(b+1) - a(a+1))/2``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return (b * (b + 1) - a * (a + 1)) / 2.0


def _bounds(n: int, parts: int) -> np.ndarray:
    """Boundaries of ``parts`` near-equal contiguous chunks of ``n`` positions (the first ``n % parts`` one longer)."""
    base, extra = divmod(int(n), int(parts))
    sizes = np.array([base + (1 if k < extra else 0) for k in range(parts)], dtype=np.int64)
    return np.concatenate([[0], np.cumsum(sizes)])


def causal_pairs_contiguous(n: int, cp: int) -> np.ndarray:
    """Causal (query, key) pairs per rank when ``n`` positions are split contiguously over ``cp``
    ranks, shape [cp] (8 positions, 2 ranks: [10, 26])."""
    e = _bounds(n, cp)
    return _pairs_between(e[:-1], e[1:])


def causal_pairs_zigzag(n: int, cp: int) -> np.ndarray:
    """Causal pairs per rank under the zig-zag split (rank ``r`` holds chunks ``r`` and ``2cp-1-r``
    of ``2cp`` near-equal chunks), shape [cp] (8 positions, 2 ranks: [18, 18]; equal when ``2cp``
    divides ``n``). Tokens per rank: :func:`zigzag_tokens`."""
    e = _bounds(n, 2 * cp)
    chunk = _pairs_between(e[:-1], e[1:])
    return np.array([chunk[r] + chunk[2 * cp - 1 - r] for r in range(cp)])


def zigzag_tokens(n: int, cp: int) -> np.ndarray:
    """Tokens per rank under the zig-zag split, shape [cp]."""
    e = _bounds(n, 2 * cp)
    size = np.diff(e).astype(np.float64)
    return np.array([size[r] + size[2 * cp - 1 - r] for r in range(cp)])


def sequence_activation_bytes(tokens: int, hidden: int, tp: int, sp: bool, element_bytes: float = 2.0) -> tuple[float, float]:
    """(bytes per GPU, bytes over the TP group) of one ``[tokens, hidden]`` activation in a TP group
    of ``tp`` GPUs: without SP every GPU holds it whole; with SP each holds ``tokens/tp`` rows
    (chapter 6.2.3; ``[8192, 4096]`` BF16, TP4: (64 MiB, 256 MiB) vs (16 MiB, 64 MiB))."""
    whole = float(tokens) * hidden * element_bytes
    per = whole / tp if sp else whole
    return per, per * tp


def ring_reduce_scatter_s(p: int, message_bytes: float, alpha_s: float, bandwidth: float) -> float:
    """Ring ReduceScatter of an ``M``-byte buffer over ``p`` GPUs: ``(p-1)·α + (p-1)·M/(p·B)``
    (half of eq. 6-9). The ring AllGather to an ``M``-byte result takes the same. Zero for p = 1."""
    if p <= 1:
        return 0.0
    return (p - 1) * alpha_s + (p - 1) * message_bytes / (p * bandwidth)


def sp_collective_s(hw, p: int, message_bytes: float) -> float:
    """ReduceScatter + AllGather replacing one TP AllReduce of ``message_bytes`` under sequence
    parallelism (Korthikanti et al. 2022), ring on the group's tier of ``hw``
    (:class:`~optimizer.model.hardware.Hardware`): equal to the ring AllReduce (eq. 6-9)."""
    link = hw.link(p)
    return 2.0 * ring_reduce_scatter_s(p, message_bytes, link.alpha_s, link.bandwidth_bytes_per_s)


def kv_exchange_layer_s(mode: str, cp: int, block_bytes: float, attention_layer_s: float, alpha_s: float,
                        bandwidth: float, ring_overlap: float = 1.0) -> tuple[float, float]:
    """(exchange time, exposed time) of one layer's K/V exchange among ``cp`` ranks (s).

    Args:
        mode: ``ring`` or ``allgather`` (module docstring).
        block_bytes: one rank's K/V block for the layer, bytes per GPU.
        attention_layer_s: the rank's attention compute in the layer (all its pairs), s.
        alpha_s, bandwidth: the tier's start-up (s) and bandwidth per GPU per direction (bytes/s).
        ring_overlap: the share of each ring transfer that runs under the block's attention.
    Returns:
        ``ring``: ``((c-1)·t_send, (c-1)·(overlapped(t_blk, t_send) - t_blk))`` with ``t_blk =
        attention_layer_s/c``; ``allgather``: ``((c-1)·t_send, (c-1)·t_send)``; (0, 0) for cp = 1.
    """
    if cp <= 1:
        return 0.0, 0.0
    t_send = alpha_s + block_bytes / bandwidth
    total = (cp - 1) * t_send
    if mode == "allgather":
        return total, total
    t_blk = attention_layer_s / cp
    return total, (cp - 1) * (float(overlapped_s(t_blk, t_send, ring_overlap)) - t_blk)


def cp_decode_merge_s(cp: int, tp: int, batch: float, q_heads: int, head_dim: int, alpha_s: float,
                      bandwidth: float) -> float:
    """Per layer, the merge of ``cp`` ranks' partial attention outputs in decode (s): each rank
    contributes ``batch·(QH/TP)·(D+2)`` FP32 values (its weighted value vector and the running
    max and sum of its softmax), all-gathered on a ring: ``(c-1)·(α + bytes/B)``. Zero for cp = 1."""
    if cp <= 1:
        return 0.0
    per_rank = batch * math.ceil(q_heads / tp) * (head_dim + 2) * FP32_BYTES
    return (cp - 1) * (alpha_s + per_rank / bandwidth)
