"""What each GPU stores, reads, computes and sends per decode step, for any model and layout.

Reference chapter equations:

* eq. 6-1 memory per GPU: weights held (sharded parts / their split, replicated parts whole)
  + KV of the sessions it holds + a reserve;
* eq. 6-2 roofline: a step takes ``max(bytes read / HBM bandwidth, FLOP / peak)``;
* eq. 6-4/6-5 decode FLOP: ``2·params`` per token plus ``4·QH·D`` per context token per layer;
* eq. 6-7 pipeline: ``b`` micro-batches through ``q`` stages of time ``t`` take ``(q + b - 1)·t``
  (utilisation ``b/(q+b-1)``);
* eq. 6-8 expected distinct experts a batch of ``b`` tokens touches: ``E·(1-(1-k/E)^b)``;
* eq. 6-9/6-10 AllReduce (ring, tree) via :class:`~optimizer.model.hardware.Hardware`.

Batched decode on a dense TP-``p`` instance with active sessions ``A`` at positions ``s_i``::

    step = max(local, compute) + 2L·T_AR(p, |A|·H·2 B)
    local   = (weights_read/p + Σ_i kv_token·(s_i+1)/min(p, KVH)) / B_HBM
    compute = (|A|·2·params_read + Σ_i 4·QH·D·(s_i+1)·L) / p / P

with ``P`` the dense tensor-core peak: BF16, or per dtype for FP8/FP4 weights and an FP8 KV cache
(:class:`PerfModel`).

MoE, MLA, hybrid and DP/EP/PP layouts generalise the terms (see :meth:`PerfModel.step`).
Units: bytes, FLOP, seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import NamedTuple, Optional

import numpy as np

from optimizer.model.config import ModelSpec
from optimizer.model.hardware import FP8_DTYPES, Hardware, peak_flops_for
from optimizer.model.layout import Layout, check_layout
from optimizer.model.overlap import check_kappa, check_micro_batches, microbatch_pair_s
from optimizer.model.weights import ACTIVATION_BYTES, NORM_BYTES, Weights, weights


def expected_active_experts(experts: int, k: int, tokens) -> np.ndarray:
    """Expected distinct experts a batch of ``tokens`` tokens visits in one MoE layer (eq. 6-8):
    ``E·(1-(1-k/E)^b)`` under uniform independent top-``k`` routing. Exactly ``k`` for one token.
    ``tokens`` may be an array; returns float array of the same shape."""
    b = np.asarray(tokens, dtype=np.float64)
    frac = np.where(b == 1, k / experts, 1.0 - (1.0 - k / experts) ** b)
    return experts * frac


def pipeline_time(stages: int, microbatches: int, stage_s: float) -> float:
    """Time for ``microbatches`` micro-batches through ``stages`` equal stages of ``stage_s`` each
    (eq. 6-7): ``(q + b - 1)·t``."""
    return (stages + microbatches - 1) * stage_s


def pipeline_utilisation(stages: int, microbatches: int) -> float:
    """Share of stage-time doing work in a pipeline (eq. 6-7): ``b/(q+b-1)``."""
    return microbatches / (stages + microbatches - 1)


class StageStep(NamedTuple):
    """What one pipeline stage's GPUs do in one step (the parts :class:`StepBreakdown` sums over
    stages), per attention-DP rank (arrays over the
    ranks, one entry per rank; seconds, bytes or FLOP as named). The step takes
    ``time = max(local, compute) + allreduce + alltoall`` (eq. 6-2 plus the alpha-beta
    collectives); the others are its parts, for the parameter layer and the explanations.

    Attributes:
        time: step time of the stage (s).
        local: HBM time of the weight and KV reads (s).
        compute: tensor-core time of the step's FLOP at peak (s).
        allreduce: tensor-parallel AllReduce time (s).
        alltoall: MoE dispatch + combine All-to-All time (s), with the experts' TP AllReduce.
        weight_bytes: weight bytes read per GPU.
        kv_bytes: KV (and recurrent state) bytes read per GPU.
        flops: FLOP per GPU.
        active_experts: routed experts active per MoE layer per GPU (0 for dense stages).
    """

    time: np.ndarray
    local: np.ndarray
    compute: np.ndarray
    allreduce: np.ndarray
    alltoall: np.ndarray
    weight_bytes: np.ndarray
    kv_bytes: np.ndarray
    flops: np.ndarray
    active_experts: float


class MicrobatchTerms(NamedTuple):
    """The two micro-batches of one stage's decode step, each pass timed alone
    (:meth:`PerfModel.microbatch_terms`).

    Attributes:
        overlapped: the halves' :class:`StageStep` over the stage's layers with a collective.
        serial: the halves' :class:`StageStep` over its other layers and its embedding / LM head
            (None when the stage has none).
        layers: how many layers the overlapped part has.
    """

    overlapped: tuple
    serial: Optional[tuple]
    layers: int


@dataclass(frozen=True)
class Stage:
    """Bytes/FLOP of one pipeline stage (its layers), per whole stage (not yet per GPU).

    Attributes (bytes unless stated):
        layers: layer indices of the stage.
        sharded: weights split over attention TP (attention, dense FFN, shared experts,
            embedding on the first stage, LM head on the last).
        kv_proj: GQA K/V projections (split over ``min(TP, KVH)``).
        replicated: weights every GPU holds whole (norms, routers, MLA ``q_a``/``kv_a``).
        routed: routed experts (split over experts TP x EP).
        sharded_read: weights read every step and counted split over attention TP (eq. 6-2 as the
            chapter applies it: attention incl. K/V projections, dense FFN, shared experts,
            routers, LM head; no embedding, no norms). The duplicated K/V-head projections (TP >
            KVH) and the replicated routers are held per GPU (memory) but, as in the chapter's
            figures, their reads are counted once per TP group.
        replicated_read: replicated matrices read whole by every GPU (MLA ``q_a``/``kv_a``, which
            vLLM keeps unsplit).
        moe_layers: MoE layers in the stage.
        kv_token: KV bytes per context token; state: fixed bytes per session.
        attn_flops_ctx: FLOP per context token; state_flops: fixed FLOP per token.
        ar_layers_attention: layers ending their mixer with an attention-TP AllReduce.
        dense_ffn_layers: layers whose FFN is dense (one more AllReduce each).
    """

    layers: tuple[int, ...]
    sharded: float
    kv_proj: float
    replicated: float
    routed: float
    sharded_read: float
    replicated_read: float
    moe_layers: int
    kv_token: float
    state: float
    attn_flops_ctx: float
    state_flops: float
    dense_ffn_layers: int


@dataclass(frozen=True)
class StepBreakdown:
    """One decode step of the active sessions on one instance (seconds, bytes, FLOP per GPU of the
    busiest stage/rank). ``total_s`` is the step time."""

    total_s: float
    local_s: float
    compute_s: float
    allreduce_s: float
    alltoall_s: float
    pipeline_s: float
    weight_bytes_read: float
    kv_bytes_read: float
    flops: float
    active_experts_per_layer: float


def stage_layers(layers: int, pp: int) -> list[tuple[int, ...]]:
    """Contiguous layer blocks of ``pp`` stages; the first ``layers % pp`` stages get one more."""
    base, extra = divmod(layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(tuple(range(start, start + n)))
        start += n
    return out


class PerfModel:
    """Memory and step time of one model at one dtype on one hardware, for any valid layout.

    Args:
        spec: the model.
        hw: the hardware.
        weight_bytes: bytes per matrix parameter; kv_bytes: bytes per KV element.
        reserve_bytes: per GPU (activations, workspace).
        weight_dtype: name of the weights' dtype (``bf16``, ``fp8``, ``fp4``, ...); sets the
            tensor-core peak of the matrix products. ``None`` (default): the BF16 peak, as before.
        kv_dtype: name of the KV cache's dtype; sets the peak of the attention products. ``None``:
            ``weight_dtype`` when ``kv_bytes`` is not given either, else the BF16 peak.

    Peaks (``compute`` of :meth:`stage_step`, eq. 6-2 ``FLOP / P``): every product with a weight
    matrix (attention projections, dense FFN, shared and routed experts, routers, LM head, MLA
    ``q_a``/``kv_a``) runs at ``P_w = hw.gpu.peak_flops_for(weight_dtype)``: FP8 weights with FP8
    activations on the FP8 tensor cores, FP4 (NVFP4) weights on Blackwell's FP4 tensor cores, as
    vLLM and TensorRT-LLM serve FP8/FP4 checkpoints (dense peaks of ``instances/hardware/catalog.yaml``,
    NVIDIA datasheets: H100 SXM FP8 3,958 TFLOPS with sparsity = 1,978.9 dense, twice BF16;
    HGX B200 FP8 9 / FP4 18 PFLOPS with sparsity = 4.5 / 9 dense). The attention score and value
    products with the KV cache run at ``P_a``: the FP8 peak when ``kv_dtype`` is ``fp8`` (FP8
    attention kernels), else the BF16 peak; linear-attention state updates at the BF16 peak. A
    GPU without a figure for a dtype (A100 has no FP8), weight-only quantisation (``int4``,
    ``int8``: dequantised to BF16) and 16/32-bit dtypes use the BF16 peak ``hw.gpu.peak_flops``,
    so every BF16 figure is unchanged::

        compute = matmul FLOP / P_w + attention FLOP / P_a + state FLOP / P_bf16

    Context and sequence parallelism (:mod:`optimizer.model.sequence`): ``cp_kv_exchange`` is how
    a CP layout's ranks see each other's K/V: ``ring`` (Ring Attention, Liu et al. 2023: blocks
    passed round the ring under the attention compute; each rank keeps only its ``1/cp`` of the
    KV) or ``allgather`` (every rank gathers and keeps the whole prompt's KV, as SGLang 0.5.14's
    dense prefill CP does). ``cp_ffn``: a CP rank's dense FFN runs on its own TP group (``rank``,
    the Megatron / Ring Attention convention) or over all the worker's GPUs (``worker``: SGLang
    0.5.14's MLP uses its global TP group, ``--tp`` = the worker's GPUs), whose all-gather +
    reduce-scatter of the whole prompt replaces the rank's FFN AllReduces. ``comm_overlap`` ``φ`` in [0, 1] is the share of each step's TP
    AllReduce / All-to-All time that runs under its compute (chapter 6.4.3):
    ``time = max(work, φ·comm) + (1-φ)·comm``; 0 (the default) is the sum, every existing figure.

    Speculative draft modules (:mod:`optimizer.model.speculative`) are timed by a PerfModel of
    their own: ``head_params`` are matrix parameters outside the layers that every step reads,
    held and read on the last stage and split over attention TP (the MTP / EAGLE module's
    ``eh_proj``/``fc`` ``2H x H`` that joins the embedding and the previous hidden state);
    ``shared_embeddings``: the embedding and LM head are the target model's (vLLM's
    ``load_eagle_model`` shares them when the draft does not own them), so they are read every
    pass but not held twice (they leave the static memory, not the step).

    Two-batch overlap (``micro_batches=2``; DeepSeek's decode deployment, SGLang
    ``--enable-two-batch-overlap``, vLLM ``--enable-dbo``): a decode step's sessions are split into
    two micro-batches whose layers alternate, one half's compute running while the other half's
    collective is on the wire (:meth:`stage_step`). Compute is a half's eq. 6-2 time
    ``max(HBM, tensor-core)`` over a layer (weights read by each half, KV of its sessions, the
    GEMM and attention FLOP of its tokens); communication its TP AllReduces, MoE dispatch/combine
    All-to-Alls (and the experts' TP AllReduce) and the CP decode merge. The layers with a
    collective are overlapped by :func:`~optimizer.model.overlap.microbatch_pair_s` at the
    contention factor ``contention_kappa`` (1: none; :meth:`optimizer.model.overlap.Contention.kappa`
    from a measured pair); the others run the halves one after the other. A batch of one per
    attention-DP rank, prefill passes and mixed (chunked-prefill) steps run as one batch. 1 (the
    default) is one batch: every existing figure. ``comm_overlap`` must be 0 with two micro-batches.

    Raises:
        ValueError: an unknown ``cp_kv_exchange`` or ``cp_ffn``, ``comm_overlap`` outside [0, 1],
            ``micro_batches`` other than 1 or 2, ``contention_kappa`` below 1, or both overlaps.
    """

    def __init__(self, spec: ModelSpec, hw: Hardware, weight_bytes: float = 2.0, kv_bytes: Optional[float] = None,
                 reserve_bytes: float = 0.0, weight_dtype: Optional[str] = None, kv_dtype: Optional[str] = None,
                 cp_kv_exchange: str = "ring", comm_overlap: float = 0.0, cp_ffn: str = "rank",
                 head_params: float = 0.0, shared_embeddings: bool = False, micro_batches: int = 1,
                 contention_kappa: float = 1.0):
        from optimizer.model.sequence import check_cp_ffn, check_cp_kv_exchange, check_overlap

        self.cp_kv_exchange = check_cp_kv_exchange(cp_kv_exchange)
        self.cp_ffn = check_cp_ffn(cp_ffn)
        self.comm_overlap = check_overlap(comm_overlap)
        self.micro_batches = check_micro_batches(micro_batches)
        self.contention_kappa = check_kappa(contention_kappa)
        if self.micro_batches == 2 and self.comm_overlap:
            raise ValueError("two micro-batches time the overlap of compute and communication themselves: "
                             f"comm_overlap must be 0 with them (got {self.comm_overlap})")
        self.spec = spec
        self.hw = hw
        self.head_params = float(head_params)
        self.shared_embeddings = bool(shared_embeddings)
        self.w: Weights = weights(spec, weight_bytes, kv_bytes)
        self.reserve_bytes = reserve_bytes
        self.weight_dtype = weight_dtype
        self.kv_dtype = kv_dtype if kv_dtype is not None or kv_bytes is not None else weight_dtype
        self._set_peaks()
        self._stages: dict[int, list[Stage]] = {}

    def _set_peaks(self) -> None:
        """The tensor-core peaks of ``self.hw`` for the weights' and the KV cache's dtypes (see above)."""
        bf16 = self.hw.gpu.peak_flops
        self.peak_flops = bf16
        self.matmul_peak_flops = peak_flops_for(self.hw.gpu, self.weight_dtype)
        self.attention_peak_flops = (peak_flops_for(self.hw.gpu, self.kv_dtype)
                                     if isinstance(self.kv_dtype, str) and self.kv_dtype.lower() in FP8_DTYPES else bf16)
        self._one_peak = self.matmul_peak_flops == bf16 and self.attention_peak_flops == bf16

    def with_hardware(self, hw: Hardware) -> "PerfModel":
        """The same model, dtypes and options on other hardware (the analytic source's achieved
        peaks, :func:`optimizer.model.efficiency.derated`); the stage cache is shared (stages hold
        bytes and FLOP, not times)."""
        import copy

        out = copy.copy(self)
        out.hw = hw
        out._set_peaks()
        return out

    # ------------------------------------------------------------------ stages
    def stages(self, pp: int) -> list[Stage]:
        """The ``pp`` stages (cached)."""
        if pp not in self._stages:
            w, m = self.w, self.spec
            b = {c: w.category_bytes(c) for c in w.per_layer}
            blocks = stage_layers(m.layers, pp)
            out = []
            moe = set(m.moe_layers)
            for s, idx in enumerate(blocks):
                ix = list(idx)
                first, last = s == 0, s == pp - 1
                emb = w.embedding if first else 0.0
                if first and pp > 1 and m.tied_embeddings:
                    emb = w.lm_head  # the first stage keeps its own copy of the tied matrix
                lm = w.lm_head if last else 0.0
                extra = self.head_params if last else 0.0
                held = 0.0 if self.shared_embeddings else lm + emb  # a draft module shares the target's
                sharded_layers = float((b["attn_split"][ix] + b["linear_attn"][ix] + b["dense_ffn"][ix] + b["shared"][ix]).sum())
                router = float(b["router"][ix].sum())
                repl_read = float(b["attn_repl"][ix].sum())
                norms = float(b["norms"][ix].sum()) + (w.final_norm * NORM_BYTES if last else 0.0)
                st_kv = float(b["attn_kv"][ix].sum())
                out.append(Stage(
                    layers=idx,
                    sharded=sharded_layers * 1.0 + (held + extra) * w.weight_bytes,
                    kv_proj=st_kv,
                    replicated=repl_read + router + norms,
                    routed=float(b["routed"][ix].sum()),
                    sharded_read=sharded_layers + st_kv + router + (lm + extra) * w.weight_bytes,
                    replicated_read=repl_read,
                    moe_layers=sum(1 for i in idx if i in moe),
                    kv_token=float(w.kv_bytes_per_token_layer[ix].sum()),
                    state=float(w.state_bytes_per_layer[ix].sum()),
                    attn_flops_ctx=float(w.attention_flops_per_context_token_layer[ix].sum()),
                    state_flops=float(w.state_flops_per_token_layer[ix].sum()),
                    dense_ffn_layers=sum(1 for i in idx if i not in moe),
                ))
            self._stages[pp] = out
        return self._stages[pp]

    def check(self, lay: Layout) -> Layout:
        """Validate a layout for this model (raises InputError naming the field)."""
        return check_layout(self.spec, lay)

    def kv_shards(self, lay: Layout) -> int:
        """GPUs a session's KV is split over: ``min(TP, KVH)`` (MLA: KVH = 1, the latent is whole on
        every attention-TP GPU; only DP attention spreads sessions)."""
        return min(lay.attention_tp, self.spec.kv_heads)

    def _kv_extra(self, st: Stage, lay: Layout) -> float:
        """Extra K/V-projection bytes when TP > KVH: each GPU holds a whole KV head's projection,
        i.e. ``kv_proj/min(TP,KVH)`` instead of ``kv_proj/TP`` (0 when TP <= KVH)."""
        p = lay.attention_tp
        shards = min(p, self.spec.kv_heads) if st.kv_proj else 1
        return st.kv_proj * (p // shards - 1) if p > shards else 0.0

    # ------------------------------------------------------------------ memory (eq. 6-1)
    def static_bytes_per_gpu(self, lay: Layout) -> float:
        """Weights per GPU plus the reserve, worst stage (eq. 6-1)::

            (sharded + kv_proj + kv_extra)/attention.tp + routed/(experts.tp·experts.ep)
            + replicated + reserve
        """
        return max(self._static(st, lay) for st in self.stages(lay.pp))

    def _static(self, st: Stage, lay: Layout) -> float:
        routed = st.routed / (lay.experts_tp * lay.experts_ep) if st.routed else 0.0
        return (st.sharded + st.kv_proj + self._kv_extra(st, lay)) / lay.attention_tp + routed + st.replicated + self.reserve_bytes

    def weight_bytes_per_gpu(self, lay: Layout) -> float:
        """Weights per GPU (worst stage), without the reserve."""
        return max(self._static(st, lay) - self.reserve_bytes for st in self.stages(lay.pp))

    def weight_bytes_total(self, lay: Layout) -> float:
        """Weights summed over every GPU of the instance (replicas counted)."""
        g = lay.gpus_per_stage
        return sum((self._static(st, lay) - self.reserve_bytes) * g for st in self.stages(lay.pp))

    def kv_bytes_per_gpu(self, lay: Layout, context: int, new: int) -> float:
        """KV (and state) bytes one session holds per GPU of its attention rank for the whole run,
        worst stage: ``kv_token·(context+new)/min(TP,KVH)/cp_split + state/TP`` (``cp_split`` of
        :meth:`cp_kv_split`: ``cp`` under the ring exchange, else 1)."""
        return max(self._kv_session(st, lay, context + new) for st in self.stages(lay.pp))

    def cp_kv_split(self, lay: Layout) -> int:
        """Ranks a session's KV is split over along the sequence: ``cp`` under the ``ring``
        exchange (each rank keeps its own zig-zag blocks), 1 under ``allgather`` (every rank keeps
        the whole KV) and for ``cp = 1``."""
        return lay.cp if lay.cp > 1 and self.cp_kv_exchange == "ring" else 1

    def _kv_session(self, st: Stage, lay: Layout, tokens) -> float:
        kv = st.kv_token * tokens / self.kv_shards(lay)
        if lay.cp > 1:
            kv = kv / self.cp_kv_split(lay)
        return kv + st.state / lay.attention_tp if st.state else kv

    def memory_per_gpu(self, lay: Layout, sessions: list[tuple[int, int]], rank: Optional[list[int]] = None) -> float:
        """Bytes on the fullest GPU of an instance holding ``sessions`` [(context, new), ...]
        (eq. 6-1). ``rank[i]`` is the attention-DP rank of session i (default: round robin)."""
        dp = lay.attention_dp
        rank = rank if rank is not None else [i % dp for i in range(len(sessions))]
        worst = 0.0
        for st in self.stages(lay.pp):
            per_rank = [0.0] * dp
            for (c, n), r in zip(sessions, rank):
                per_rank[r] += self._kv_session(st, lay, c + n)
            worst = max(worst, self._static(st, lay) + max(per_rank))
        return worst

    def stage_memory_terms(self, lay: Layout, sessions: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """Per pipeline stage: (static bytes per GPU incl. reserve, KV bytes per GPU of each
        session in ``sessions`` [(context, new)]), shapes [pp] and [pp, len(sessions)]. The
        memory per GPU is ``max_stage(static + max_rank Σ kv of the rank)`` (eq. 6-1)."""
        stages = self.stages(lay.pp)
        static = np.array([self._static(st, lay) for st in stages])
        kv = np.array([[self._kv_session(st, lay, c + n) for c, n in sessions] for st in stages]).reshape(len(stages), len(sessions))
        return static, kv

    def max_sessions(self, lay: Layout, context: int, new: int) -> int:
        """How many identical sessions fit one instance: ``dp x`` the fewest per rank over stages."""
        best = None
        for st in self.stages(lay.pp):
            room = self.hw.gpu.memory_bytes - self._static(st, lay)
            if room < 0:
                return 0
            kv = self._kv_session(st, lay, context + new)
            n = int(room // kv) if kv > 0 else 10 ** 9
            best = n if best is None else min(best, n)
        return best * lay.attention_dp

    # ------------------------------------------------------------------ time
    def stage_step(self, st: Stage, lay: Layout, b_rank: np.ndarray, ctx_rank: np.ndarray, b_total: float,
                   expert_loads: Optional[np.ndarray] = None) -> StageStep:
        """The decode step of one stage for ranks with ``b_rank`` sessions and ``Σ(s_i+1)`` =
        ``ctx_rank`` (arrays of one shape, one entry per attention-DP rank; ``b_total`` in all):
        :meth:`stage_terms` (one batch), or with ``micro_batches=2`` and a batch that splits
        (:meth:`microbatch_halves`) the two halves overlapped (:meth:`microbatch_terms`,
        :meth:`microbatch_time`). Under two micro-batches the parts (``local``, ``compute``,
        ``allreduce``, ``alltoall``, bytes, FLOP) are the two halves' sums (the work each resource
        does) and ``active_experts`` the larger half's.

        Returns:
            StageStep: time and its parts, arrays over the ranks.
        Raises:
            ValueError: ``expert_loads`` of a shape other than ``[experts]`` or ``[MoE layers, experts]``.
        """
        mbt = self.microbatch_terms(st, lay, b_rank, ctx_rank, b_total, expert_loads)
        if mbt is None:
            return self.stage_terms(st, lay, b_rank, ctx_rank, b_total, expert_loads)
        parts = mbt.overlapped + (mbt.serial or ())
        total = lambda i: sum(np.asarray(x[i], dtype=np.float64) for x in parts)  # noqa: E731
        return StageStep(self.microbatch_time(mbt), total(1), total(2), float(total(3)), float(total(4)),
                         total(5), total(6), total(7), max(float(x[8]) for x in parts))

    # ------------------------------------------------------------------ two-batch overlap
    def microbatch_halves(self, b_rank) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """The two micro-batches of a decode step under ``micro_batches=2``: each attention-DP
        rank's ``b_r`` sessions split ``b_r - floor(b_r/2)`` and ``floor(b_r/2)`` (a micro-batch
        holds whole sequences). None (one batch) with ``micro_batches=1`` or when a rank has fewer
        than 2 sessions: a batch of one cannot be split, and the engines micro-batch every DP rank
        or none (vLLM ``ubatch_utils``: "Either all ranks run with microbatching or none of them do")."""
        if self.micro_batches == 1:
            return None
        b = np.atleast_1d(np.asarray(b_rank, dtype=np.float64))
        if b.size == 0 or float(b.min()) < 2.0:
            return None
        h2 = np.floor(b / 2.0)
        return b - h2, h2

    def comm_layers(self, lay: Layout, layers) -> tuple[int, ...]:
        """The layers of ``layers`` whose pass on ``lay`` ends in a collective (what two
        micro-batches overlap): every layer when attention TP > 1 (its AllReduce), MoE layers when
        the experts span more than one GPU (dispatch/combine All-to-All, or the experts' TP
        AllReduce), layers holding K/V under CP (the decode merge, :meth:`cp_merge_s`)."""
        moe = set(self.spec.moe_layers) if self.spec.moe is not None else set()
        kv = self.w.kv_bytes_per_token_layer
        return tuple(i for i in layers if lay.attention_tp > 1 or (i in moe and lay.gpus_per_cp_rank > 1)
                     or (lay.cp > 1 and kv[i] > 0))

    def _layer_block(self, ix: tuple[int, ...]) -> Stage:
        """A :class:`Stage` of the layers ``ix`` alone (no embedding, LM head or final norm): the
        per-layer terms of :meth:`stages`, for the overlapped part of a micro-batched stage."""
        w, m = self.w, self.spec
        b = {c: w.category_bytes(c) for c in w.per_layer}
        i = list(ix)
        moe = set(m.moe_layers)
        sharded_layers = float((b["attn_split"][i] + b["linear_attn"][i] + b["dense_ffn"][i] + b["shared"][i]).sum())
        router = float(b["router"][i].sum())
        repl_read = float(b["attn_repl"][i].sum())
        st_kv = float(b["attn_kv"][i].sum())
        return Stage(layers=tuple(ix), sharded=sharded_layers, kv_proj=st_kv,
                     replicated=repl_read + router + float(b["norms"][i].sum()), routed=float(b["routed"][i].sum()),
                     sharded_read=sharded_layers + st_kv + router, replicated_read=repl_read,
                     moe_layers=sum(1 for j in ix if j in moe), kv_token=float(w.kv_bytes_per_token_layer[i].sum()),
                     state=float(w.state_bytes_per_layer[i].sum()),
                     attn_flops_ctx=float(w.attention_flops_per_context_token_layer[i].sum()),
                     state_flops=float(w.state_flops_per_token_layer[i].sum()),
                     dense_ffn_layers=sum(1 for j in ix if j not in moe))

    def overlap_split(self, st: Stage, lay: Layout) -> Optional[tuple[Stage, Optional[Stage]]]:
        """``st`` as (its layers with a collective, :meth:`comm_layers`; the rest: the other
        layers plus the stage's embedding, LM head and final norm, or None when there is none),
        the two adding up to ``st``. None when no layer of the stage has a collective (nothing to
        overlap: the step runs as one batch). ``st`` must be one of :meth:`stages` (unscaled)."""
        key = (st.layers, lay.attention_tp > 1, lay.gpus_per_cp_rank > 1, lay.cp > 1)
        cache = self.__dict__.setdefault("_overlap_split", {})
        if key not in cache:
            ix = self.comm_layers(lay, st.layers)
            if not ix:
                cache[key] = None
            else:
                comm = self._layer_block(ix)
                rest_ix = tuple(i for i in st.layers if i not in set(ix))
                nums = ("sharded", "kv_proj", "replicated", "routed", "sharded_read", "replicated_read", "kv_token",
                        "state", "attn_flops_ctx", "state_flops")
                rest = Stage(layers=rest_ix, moe_layers=st.moe_layers - comm.moe_layers,
                             dense_ffn_layers=st.dense_ffn_layers - comm.dense_ffn_layers,
                             **{f: max(0.0, getattr(st, f) - getattr(comm, f)) for f in nums})
                empty = not rest_ix and rest.sharded_read <= 1e-9 * max(st.sharded_read, 1.0) \
                    and rest.replicated_read <= 1e-9 * max(st.replicated_read, 1.0)
                cache[key] = (comm, None if empty else rest)
        return cache[key]

    def microbatch_terms(self, st: Stage, lay: Layout, b_rank, ctx_rank, b_total: float, expert_loads=None,
                         attn_scale=None) -> Optional["MicrobatchTerms"]:
        """The two micro-batches of a decode step of stage ``st``, each timed alone by
        :meth:`stage_terms` (None: the step runs as one batch, see :meth:`microbatch_halves` and
        :meth:`overlap_split`).

        Half ``h`` of rank ``r`` has ``h_r`` sessions (:meth:`microbatch_halves`) and the share
        ``h_r/b_r`` of the rank's KV positions ``ctx_rank`` (exact when the rank's sessions are at
        one position). Each half is a pass of its own: it reads the layer's weights again (its MoE
        layers touch eq. 6-8's experts of its own tokens) and its collectives pay their latency
        again. ``expert_loads`` (tokens per expert) are scaled by each half's share of the tokens.
        ``attn_scale``: attention FLOP per KV token read, per rank (the prefill module's
        ``attn/kv``; None: 1, decode)."""
        halves = self.microbatch_halves(b_rank)
        if halves is None:
            return None
        split = self.overlap_split(st, lay)
        if split is None:
            return None
        comm, rest = split
        if attn_scale is not None:
            comm = replace(comm, attn_flops_ctx=comm.attn_flops_ctx * attn_scale)
            rest = None if rest is None else replace(rest, attn_flops_ctx=rest.attn_flops_ctx * attn_scale)
        b = np.atleast_1d(np.asarray(b_rank, dtype=np.float64))
        ctx = np.broadcast_to(np.asarray(ctx_rank, dtype=np.float64), b.shape)
        over, ser = [], []
        for h in halves:
            ctx_h = ctx * (h / b)
            bt = float(h.sum())
            loads = None if expert_loads is None else np.asarray(expert_loads, dtype=np.float64) * (bt / b_total)
            over.append(self.stage_terms(comm, lay, h, ctx_h, bt, loads))
            if rest is not None:
                ser.append(self.stage_terms(rest, lay, h, ctx_h, bt, loads))
        return MicrobatchTerms(tuple(over), tuple(ser) if rest is not None else None, len(comm.layers))

    def microbatch_time(self, terms: "MicrobatchTerms", memory: float = 1.0, compute: float = 1.0,
                        network: float = 1.0) -> np.ndarray:
        """Stage time (s, per rank) of two micro-batches (:class:`MicrobatchTerms`): over the
        layers with a collective :func:`~optimizer.model.overlap.microbatch_pair_s` of the halves'
        compute ``W_h = max(local, compute)`` (eq. 6-2) and communication ``A_h = AllReduce +
        All-to-All`` (with the CP merge) at the model's ``contention_kappa``; the other layers
        (and embedding / LM head) run both halves one after the other, ``Σ_h W_h + A_h``.
        ``memory``, ``compute``, ``network``: efficiencies dividing the three parts."""
        def work(x):
            return np.maximum(np.asarray(x.local, dtype=np.float64) / memory, np.asarray(x.compute, dtype=np.float64) / compute)

        def comm(x):
            return (x.allreduce + x.alltoall) / network

        h1, h2 = terms.overlapped
        t = microbatch_pair_s((work(h1), work(h2)), (comm(h1), comm(h2)), terms.layers, self.contention_kappa)
        for x in terms.serial or ():
            t = t + work(x) + comm(x)
        return t

    def stage_terms(self, st: Stage, lay: Layout, b_rank: np.ndarray, ctx_rank: np.ndarray, b_total: float,
                    expert_loads: Optional[np.ndarray] = None) -> StageStep:
        """One pass of one stage as one batch (every token together) for ranks with ``b_rank``
        tokens and ``Σ(s_i+1)`` = ``ctx_rank`` (arrays of one shape, one entry per attention-DP
        rank; ``b_total`` tokens in all): ``time = max(local, compute) + allreduce + alltoall``
        (with ``comm_overlap`` φ: ``max(work, φ·comm) + (1-φ)·comm``). Prefill passes and mixed
        steps are always timed so; decode steps go through :meth:`stage_step`.

        Returns:
            StageStep: time and its parts, arrays over the ranks.
        Raises:
            ValueError: ``expert_loads`` of a shape other than ``[experts]`` or ``[MoE layers, experts]``.
        """
        m, hw, wb = self.spec, self.hw, self.w.weight_bytes
        p = lay.attention_tp
        if lay.cp > 1:  # decode on CP ranks: each rank's attention reads its 1/cp of the sessions' KV
            split = self.cp_kv_split(lay)
            if split == 1:
                raise ValueError(f"{lay.label()}: decode on context-parallel ranks needs the KV split over the ranks "
                                 "(cp_kv_exchange 'ring'; under 'allgather' every rank holds the whole KV)")
            ctx_rank = np.asarray(ctx_rank, dtype=np.float64) / split
        sharded_read = st.sharded_read / p + st.replicated_read
        active = 0.0
        routed_read = 0.0
        routed_flops = 0.0
        if st.moe_layers:
            mo = m.moe
            per_group = mo.experts / lay.experts_ep
            if expert_loads is None:
                active = float(expected_active_experts(mo.experts, mo.experts_per_token, b_total)) / lay.experts_ep
                tokens_busiest = b_total * mo.experts_per_token / lay.experts_ep
                active_sum, tokens_sum = st.moe_layers * active, st.moe_layers * tokens_busiest
            else:
                loads = np.atleast_2d(np.asarray(expert_loads, dtype=np.float64))
                if loads.ndim != 2 or loads.shape[1] != mo.experts or loads.shape[0] not in (1, len(m.moe_layers)):
                    raise ValueError(f"expert_loads must have shape [{mo.experts}] or [{len(m.moe_layers)}, {mo.experts}] "
                                     f"(got {np.shape(expert_loads)})")
                if loads.shape[0] > 1:  # one row per MoE layer: this stage's rows
                    in_stage = set(st.layers)
                    loads = loads[[j for j, layer in enumerate(m.moe_layers) if layer in in_stage]]
                else:
                    loads = np.repeat(loads, st.moe_layers, axis=0)
                groups = loads.reshape(loads.shape[0], lay.experts_ep, int(per_group))
                busiest_active = (groups > 0).sum(axis=2).max(axis=1)
                busiest_tokens = groups.sum(axis=2).max(axis=1)
                active_sum, tokens_sum = float(busiest_active.sum()), float(busiest_tokens.sum())
                active = active_sum / st.moe_layers
                tokens_busiest = tokens_sum / st.moe_layers
            etp = lay.experts_tp
            routed_read = active_sum * self.w.expert_bytes / etp
            routed_flops = tokens_sum * 2 * self.w.expert_params / etp
        weight_read = sharded_read + routed_read
        kv_read = st.kv_token * ctx_rank / self.kv_shards(lay)
        if st.state:
            kv_read = kv_read + 2 * st.state * b_rank / p  # the state is read and written back
        local = (weight_read + kv_read) / hw.gpu.hbm_bytes_per_s
        params_sharded = st.sharded_read / wb
        flops = (b_rank * 2 * params_sharded + st.attn_flops_ctx * ctx_rank) / p
        extra = b_rank * 2 * st.replicated_read / wb + routed_flops + st.state_flops * b_rank / p
        if st.replicated_read or routed_flops or st.state_flops:
            flops = flops + extra
        if self._one_peak:  # one peak for every product (BF16, or a GPU without the dtype's figure)
            compute = flops / self.peak_flops
        else:  # weight products at the weights' dtype peak, attention at the KV's (class docstring)
            matmul = b_rank * 2 * params_sharded / p + b_rank * 2 * st.replicated_read / wb + routed_flops
            compute = (matmul / self.matmul_peak_flops + st.attn_flops_ctx * ctx_rank / p / self.attention_peak_flops
                       + st.state_flops * b_rank / p / self.peak_flops)
        # communication
        H = m.hidden
        b_max = float(np.max(b_rank))
        mixer_layers = len(st.layers)
        ar_count = mixer_layers + st.dense_ffn_layers
        a2a = 0.0
        if st.moe_layers and lay.experts_ep == 1 and lay.attention_dp == 1:
            ar_count += st.moe_layers  # experts split like attention: one more AllReduce per layer
        elif st.moe_layers:
            # dispatch and combine All-to-All per MoE layer among the GPUs of the stage; each
            # attention-TP GPU sends its 1/tp slice of its rank's tokens to k experts
            n = lay.gpus_per_cp_rank
            out_bytes = b_max / p * m.moe.experts_per_token * H * ACTIVATION_BYTES * (n - 1) / n
            a2a = 2 * st.moe_layers * hw.alltoall_s(n, out_bytes)
            if lay.experts_tp > 1:
                a2a += st.moe_layers * hw.allreduce_s(lay.experts_tp, tokens_busiest * H * ACTIVATION_BYTES)
        if lay.sp:  # Megatron SP: each AllReduce becomes ReduceScatter + AllGather (Korthikanti et al. 2022)
            from optimizer.model.sequence import sp_collective_s

            ar = ar_count * sp_collective_s(hw, p, b_max * H * ACTIVATION_BYTES)
        else:
            ar = ar_count * hw.allreduce_s(p, b_max * H * ACTIVATION_BYTES)
        if lay.cp > 1:  # merge of the CP ranks' partial attention outputs, one per KV layer (counted in alltoall)
            a2a = a2a + self.cp_merge_s(st, lay, b_max)
        phi = self.comm_overlap
        if phi:  # chapter 6.4.3: the overlapped share runs under the compute
            time = np.maximum(np.maximum(local, compute), phi * (ar + a2a)) + (1.0 - phi) * (ar + a2a)
        else:
            time = np.maximum(local, compute) + ar + a2a
        return StageStep(time, local, compute, ar, a2a, weight_read, kv_read, flops, active)

    def cp_merge_s(self, st: Stage, lay: Layout, batch: float) -> float:
        """Per decode step of stage ``st``, the merge of the ``cp`` ranks' partial attention outputs
        (s): one :func:`~optimizer.model.sequence.cp_decode_merge_s` per layer holding K/V (a
        linear-attention layer keeps a whole state on every rank), ``batch`` tokens, over the tier
        the stage's ``cp x TP x DP`` GPUs span (scale-up within a server, scale-out across). MLA
        merges its ``v_head_dim`` value vectors. Zero for cp = 1."""
        if lay.cp <= 1 or batch <= 0:
            return 0.0
        from optimizer.model.sequence import cp_decode_merge_s

        m = self.spec
        kv_layers = int(np.count_nonzero(self.w.kv_bytes_per_token_layer[list(st.layers)] > 0))
        head_dim = m.mla.v_head_dim if m.mla else m.head_dim
        link = self.hw.link(lay.gpus_per_stage)
        return kv_layers * cp_decode_merge_s(lay.cp, lay.attention_tp, batch, m.q_heads, head_dim,
                                             link.alpha_s, link.bandwidth_bytes_per_s)

    def single_session_step_s(self, lay: Layout, positions) -> np.ndarray:
        """Step time (s) of one session alone at each context position in ``positions`` (shape
        [n] -> [n]); the |A| = 1 case of :meth:`step` vectorised over steps (stages and PP
        hand-offs summed, as for one micro-batch)."""
        s1 = np.asarray(positions, dtype=np.float64) + 1.0
        ones = np.ones_like(s1)
        total = np.zeros_like(s1)
        stages = self.stages(lay.pp)
        for k, st in enumerate(stages):
            t = self.stage_step(st, lay, ones, s1, 1.0, None)[0]
            total = total + t if k else t
            if k < len(stages) - 1:
                total = total + self.hw.p2p_s(self.spec.hidden * ACTIVATION_BYTES, self.crosses_servers(lay, k))
        return total

    def crosses_servers(self, lay: Layout, stage: int) -> bool:
        """Whether the hand-off after pipeline ``stage`` of ``lay`` leaves its server (scale-out)."""
        g, s = lay.gpus_per_stage, self.hw.server.gpus
        return (stage * g) // s != ((stage + 1) * g) // s

    def step(self, lay: Layout, positions, rank=None, expert_loads=None, microbatches: int = 1) -> StepBreakdown:
        """One decode step of every active session (batched decode), per GPU of the busiest rank.

        Args:
            lay: the layout (validated by the caller or :meth:`check`).
            positions: context positions ``s_i`` of the active sessions, shape [n] (each reads
                ``s_i + 1`` tokens of KV, eq. 6-2).
            rank: attention-DP rank of each session, shape [n] (default round robin).
            expert_loads: tokens per routed expert in this step, shape [E] or [MoE layers, E]
                (default: eq. 6-8 expectation); the busiest EP group sets the time.
            microbatches: sessions split round robin into this many micro-batches flowing through
                the ``pp`` stages (eq. 6-7: ``Σ_s t_s + (m-1)·max_s t_s``, ``(q+m-1)·t`` for equal stages).
        Returns:
            :class:`StepBreakdown`; weight/KV bytes and FLOP are per GPU, summed over stages.
        Raises:
            ValueError: ``expert_loads`` of the wrong shape; a context-parallel layout under the
                ``allgather`` KV exchange (decode needs the KV split over the ranks).

        Context parallelism (``cp > 1``, decode of sessions already in the KV cache): each CP
        rank is a copy of the TP x DP group with the same weights and every rank computes the
        batch's projections and FFN (GEMMs and their AllReduces as without CP), while its
        attention reads only its ``1/cp`` of each session's KV (``S_r/cp`` in the KV read and
        attention FLOP); the ranks then merge their partial outputs by their softmax statistics
        (:meth:`cp_merge_s`, added to ``alltoall``), as vLLM's decode context parallel and Helix
        (Bhatia et al. 2025) merge KV-split attention. Unlike vLLM's DCP, which splits the KV
        inside the TP group, the CP ranks here are extra GPUs holding the weights again.

        Attention-DP ranks without sessions still run every layer (they join the MoE
        All-to-Alls, as vLLM and SGLang run a dummy batch), so they read their weights too.

        Per stage and rank r (``b_r`` sessions, ``S_r = Σ(s_i+1)``):
            ``local = (sharded_read/TP + replicated_read + MoE·A·expert/etp
            + kv_token·S_r/min(TP,KVH) + 2·state·b_r/TP) / B_HBM`` with A the busiest EP group's
            active experts (eq. 6-8 / loads); ``compute = (b_r·2·params_sharded + attn_ctx·S_r)/TP
            + b_r·2·params_replicated + tokens_busiest·2·expert_params/etp``; plus TP AllReduces
            ``T_AR(TP, b_r·H·2)`` (one per layer, one per dense FFN, one per MoE layer when experts
            follow attention TP), else two All-to-Alls per MoE layer; plus PP hand-offs ``α + b·H·2/B``.
        """
        pos = np.asarray(positions, dtype=np.float64).reshape(-1)
        n = pos.size
        dp = lay.attention_dp
        rank = np.arange(n) % dp if rank is None else np.asarray(rank, dtype=int)
        m_count = max(1, min(microbatches, n)) if lay.pp > 1 else 1
        mb = np.arange(n) % m_count
        stage_t = np.zeros((m_count, lay.pp))
        acc = dict(local=0.0, compute=0.0, ar=0.0, a2a=0.0, wr=0.0, kv=0.0, fl=0.0, act=0.0)
        for j in range(m_count):
            sel = mb == j
            b_rank = np.bincount(rank[sel], minlength=dp).astype(np.float64)
            ctx_rank = np.bincount(rank[sel], weights=pos[sel] + 1.0, minlength=dp)
            b_total = float(sel.sum())
            for k, st in enumerate(self.stages(lay.pp)):
                t, lo, co, ar, a2a, wr, kv, fl, act = self.stage_step(st, lay, b_rank, ctx_rank, b_total, expert_loads)
                r = int(np.argmax(t))
                hand = self.hw.p2p_s(b_total * self.spec.hidden * ACTIVATION_BYTES, self.crosses_servers(lay, k)) \
                    if k < lay.pp - 1 else 0.0
                stage_t[j, k] = t[r] + hand
                if j == 0:
                    acc["local"] += float(lo[r]); acc["compute"] += float(np.atleast_1d(co)[r])
                    acc["ar"] += ar; acc["a2a"] += a2a; acc["wr"] += wr
                    acc["kv"] += float(np.atleast_1d(kv)[r]); acc["fl"] += float(np.atleast_1d(fl)[r])
                    acc["act"] = max(acc["act"], act)
        per_stage = stage_t.max(axis=0)
        total = float(per_stage.sum() + (m_count - 1) * per_stage.max())
        return StepBreakdown(total, acc["local"], acc["compute"], acc["ar"], acc["a2a"],
                             total - float(stage_t[0].sum()) if lay.pp > 1 else 0.0,
                             acc["wr"], acc["kv"], acc["fl"], acc["act"])

    def decode_step_floor(self, lay: Layout, b_max: int) -> Optional["StepFloor"]:
        """A lower bound of every batched decode step of ``lay`` with up to ``b_max`` sessions,
        linear in the KV read and concave in the batch size (what the batched column bounds of the
        deployment problem sum over a run).

        For every active set A (``b = |A| ≤ b_max`` sessions at positions ``s_i``, any split over
        the attention-DP ranks):

            ``step(A) ≥ g[b] + kv_rate · Σ_{i∈A} (s_i + 1) / dp``

        where ``f[b]`` is the step's zero-context part: per stage the HBM time of the weights a
        step of b tokens reads (eq. 6-2 with the eq. 6-8 expected active experts) and the state
        read averaged over the ranks, plus ``(1 − comm_overlap)`` times its collectives at the
        fewest sessions any rank can have (``ceil(b/dp)``; the AllReduce / All-to-All times are the
        smallest at that or any larger rank batch), plus the PP hand-offs; ``kv_rate`` is the HBM
        time of one token position of KV per stage (``kv_token / min(TP, KVH) / cp_split / B``);
        ``g`` is the largest concave sequence below ``f`` with ``g[0] = 0`` (an LP, HiGHS), so
        sums of ``g`` over the steps of a run are minimised by the run with the fewest, fullest
        steps (Gale-Ryser / Karamata, :mod:`optimizer.deployment.bounded`). Compute
        (``max(local, compute)``) is bounded by its HBM part.

        Returns:
            :class:`StepFloor`, or None under two micro-batches (a step is then two overlapped
            halves, not this sum).
        """
        if self.micro_batches != 1:
            return None
        dp = lay.attention_dp
        b_max = max(1, int(b_max))
        stages = self.stages(lay.pp)
        keep = 1.0 - self.comm_overlap
        f = np.zeros(b_max + 1)
        comm = np.zeros(b_max + 1)  # collectives with the fullest rank holding x sessions
        kv_rate = 0.0
        for k, st in enumerate(stages):
            zero = np.zeros(dp)
            one = np.zeros(dp)
            one[0] = 1.0
            l0 = float(np.max(self.stage_terms(st, lay, zero, zero, 0.0).local))
            kv_rate += float(np.max(self.stage_terms(st, lay, zero, one, 0.0).local)) - l0
            for b in range(1, b_max + 1):
                avg = np.full(dp, b / dp)  # the ranks' average state read (the weights are every rank's)
                f[b] += float(np.max(self.stage_terms(st, lay, avg, zero, float(b)).local))
            for x in range(1, -(-b_max // dp) + 1):
                fullest = np.zeros(dp)
                fullest[0] = float(x)  # the collectives of a step whose fullest rank holds x sessions
                pc = self.stage_terms(st, lay, fullest, zero, float(x))
                comm[x] += float(np.max(pc.allreduce)) + float(np.max(pc.alltoall))
            if k < len(stages) - 1:
                f[1:] += np.array([self.hw.p2p_s(b * self.spec.hidden * ACTIVATION_BYTES, self.crosses_servers(lay, k))
                                   for b in range(1, b_max + 1)])
        # collectives of b sessions: the fullest rank holds x >= ceil(b/dp) of them; the fewest
        # seconds over every such x (a measured table need not grow with the message)
        top = -(-b_max // dp)
        suffix = np.minimum.accumulate(comm[1:top + 1][::-1])[::-1]
        for b in range(1, b_max + 1):
            f[b] += keep * suffix[-(-b // dp) - 1]
        return StepFloor(_concave_floor(f), kv_rate, dp)

    def step_time_s(self, lay: Layout, positions, **kw) -> float:
        """Step time (s) of the active sessions at ``positions`` (see :meth:`step`)."""
        return self.step(lay, positions, **kw).total_s

    @cached_property
    def summary(self) -> dict:
        """The weight inventory as a JSON-ready dict (see :meth:`Weights.as_dict`)."""
        return self.w.as_dict()


class StepFloor(NamedTuple):
    """:meth:`PerfModel.decode_step_floor`: ``step(A) ≥ g[|A|] + kv_rate · Σ(s_i + 1) / dp``.

    Attributes:
        g: seconds, shape [b_max + 1], ``g[0] = 0``, concave and nondecreasing.
        kv_rate: seconds per token position of KV read on one rank.
        dp: attention-DP ranks the KV is averaged over.
    """

    g: np.ndarray
    kv_rate: float
    dp: int


def _concave_floor(f: np.ndarray) -> np.ndarray:
    """The concave sequence ``g ≤ f`` with ``g[0] = 0`` of the largest sum (an LP over
    ``g[1..n]`` with the second differences ≤ 0, HiGHS), made nondecreasing (a nondecreasing ``f``
    allows it); ``f`` itself when it is concave already (the usual case: expected active experts
    and alpha-beta collectives are concave in the batch)."""
    f = np.asarray(f, dtype=np.float64)
    n = f.size - 1
    d = np.diff(f)
    if n <= 1 or np.all(np.diff(d) <= 1e-15 * max(1.0, float(np.max(np.abs(f))))):
        g = f.copy()
    else:
        import highspy

        from optimizer.highs import new_highs

        h = new_highs()
        lp = highspy.HighsLp()
        lp.num_col_ = n
        lp.col_cost_ = -np.ones(n)
        lp.col_lower_ = np.full(n, -highspy.kHighsInf)
        lp.col_upper_ = f[1:].copy()
        # row b (b = 1..n-1): g[b+1] - 2 g[b] + g[b-1] <= 0, with g[0] = 0 (column j is g[j+1])
        starts, idx, val = [0], [], []
        for j in range(n):
            rows = [(j - 1, 1.0), (j, -2.0), (j + 1, 1.0)]  # g[j+1] in the rows of b = j, j+1, j+2
            for r, v in sorted(rows):
                if 0 <= r < n - 1:
                    idx.append(r)
                    val.append(v)
            starts.append(len(idx))
        lp.num_row_ = n - 1
        lp.row_lower_ = np.full(n - 1, -highspy.kHighsInf)
        lp.row_upper_ = np.zeros(n - 1)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(idx, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(val)
        h.passModel(lp)
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            raise RuntimeError("concave floor LP not solved")
        g = np.concatenate(([0.0], np.minimum(np.array(h.getSolution().col_value), f[1:])))
    g[0] = 0.0
    # a concave g that falls at the end can be held flat from its peak (still concave, still ≤ f)
    top = int(np.argmax(g))
    g[top:] = g[top]
    return g


def _affine_key(lay: Layout, b_rank) -> tuple:
    return (lay, tuple(int(b) for b in b_rank))


class BatchStepTable:
    """Vectorised batched decode steps of one model (a helper of :meth:`PerfModel.step`).

    For a fixed layout and a fixed number of active sessions per attention-DP rank, every term
    of a stage's step time is affine in the rank's ``S_r = Σ(s_i+1)``: local (HBM) time
    ``l0 + l1·S_r``, compute time ``c0 + c1·S_r``, and the collectives are constant. The table
    caches these coefficients per (layout, sessions per rank) and evaluates a run of steps in
    which every active session advances by one token per step in one numpy expression. Under
    ``micro_batches=2`` each half's terms are affine in ``S_r`` as well (a half holds the share
    ``h_r/b_r`` of the rank's positions) and are combined per step as :meth:`PerfModel.stage_step`
    does. It equals :meth:`PerfModel.step` (``microbatches=1``, default expert loads) to
    floating-point rounding (tests compare them).
    """

    def __init__(self, perf: "PerfModel"):
        self.perf = perf
        self._coef: dict[tuple, list] = {}

    @staticmethod
    def _affine(zero: StageStep, one: StageStep, shape) -> tuple:
        """(l0, l1, c0, c1, comm) of a pass timed at ``S_r = 0`` and ``S_r = 1``."""
        l0 = np.broadcast_to(zero[1], shape).astype(np.float64)
        l1 = np.broadcast_to(one[1], shape) - l0
        c0 = np.broadcast_to(zero[2], shape).astype(np.float64)
        c1 = np.broadcast_to(one[2], shape) - c0
        return l0, l1, c0, c1, float(zero[3] + zero[4])

    def _coefficients(self, lay: Layout, b_rank: np.ndarray) -> list:
        key = _affine_key(lay, b_rank)
        if key not in self._coef:
            perf = self.perf
            b = np.asarray(b_rank, dtype=np.float64)
            b_total = float(b.sum())
            rows = []
            for k, st in enumerate(perf.stages(lay.pp)):
                hand = perf.hw.p2p_s(b_total * perf.spec.hidden * ACTIVATION_BYTES, perf.crosses_servers(lay, k)) \
                    if k < lay.pp - 1 else 0.0
                mb0 = perf.microbatch_terms(st, lay, b, np.zeros_like(b), b_total)
                if mb0 is not None:  # two micro-batches: each half's terms are affine in S_r too
                    mb1 = perf.microbatch_terms(st, lay, b, np.ones_like(b), b_total)
                    over = [self._affine(z, o, b.shape) for z, o in zip(mb0.overlapped, mb1.overlapped)]
                    ser = [self._affine(z, o, b.shape) for z, o in zip(mb0.serial or (), mb1.serial or ())]
                    rows.append(("two", over, ser, mb0.layers, hand))
                    continue
                zero = perf.stage_terms(st, lay, b, np.zeros_like(b), b_total, None)
                one = perf.stage_terms(st, lay, b, np.ones_like(b), b_total, None)
                rows.append(("one", self._affine(zero, one, b.shape), hand))
            self._coef[key] = rows
        return self._coef[key]

    def step_times_s(self, lay: Layout, positions, steps: int, rank=None) -> np.ndarray:
        """Times (s) of ``steps`` consecutive batched decode steps: in step j (0-based) the active
        sessions are at positions ``positions + j`` (shape [n], DP ``rank`` shape [n], default
        round robin). Returns shape [steps]."""
        pos = np.asarray(positions, dtype=np.float64).reshape(-1)
        dp = lay.attention_dp
        rank = np.arange(pos.size) % dp if rank is None else np.asarray(rank, dtype=int)
        b_rank = np.bincount(rank, minlength=dp).astype(np.float64)
        ctx0 = np.bincount(rank, weights=pos + 1.0, minlength=dp)
        j = np.arange(steps, dtype=np.float64)[:, None]
        ctx = ctx0[None, :] + j * b_rank[None, :]  # [steps, dp]
        total = np.zeros(steps)
        phi = self.perf.comm_overlap

        def work(l0, l1, c0, c1):
            return np.maximum(l0 + l1 * ctx, c0 + c1 * ctx)

        for row in self._coefficients(lay, b_rank):
            if row[0] == "two":
                _, over, ser, layers, hand = row
                t = microbatch_pair_s(tuple(work(*c[:4]) for c in over), tuple(c[4] for c in over), layers,
                                      self.perf.contention_kappa)
                for c in ser:
                    t = t + work(*c[:4]) + c[4]
            else:
                _, (l0, l1, c0, c1, comm), hand = row
                if phi:
                    t = np.maximum(work(l0, l1, c0, c1), phi * comm) + (1.0 - phi) * comm
                else:
                    t = work(l0, l1, c0, c1) + comm
            total = total + t.max(axis=1) + hand
        return total


def batch_step_table(perf: "PerfModel") -> BatchStepTable:
    """The (cached) :class:`BatchStepTable` of ``perf``."""
    tab = getattr(perf, "_batch_table", None)
    if tab is None:
        tab = BatchStepTable(perf)
        perf._batch_table = tab
    return tab
