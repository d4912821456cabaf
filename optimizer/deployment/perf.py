"""Performance model of a deployment problem: a thin view of :mod:`optimizer.model.perf`.

A TP-``p`` instance is the layout ``attention: {tp: p, dp: 1}, experts: {tp: p, ep: 1}, pp: 1``
(:meth:`optimizer.model.layout.Layout.tp`); every figure (memory per GPU, eq. 6-1; step time,
eqs. 6-2, 6-4, 6-5, 6-8; AllReduce, eqs. 6-9, 6-10) comes from the shared model, one code path.
Units: bytes, seconds, FLOP. Symbols: H hidden, QH query heads, KVH KV heads, D head dim, F FFN
size, L layers, V vocabulary, p TP degree, s context position.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from optimizer.model.collectives import AllReduceSource
from optimizer.deployment.schema import Problem
from optimizer.model.config import ModelSpec
from optimizer.model.decode_steps import DecodeSteps, decode_steps
from optimizer.model.hardware import Hardware
from optimizer.model.layout import Layout
from optimizer.model.perf import PerfModel as SharedPerfModel
from optimizer.model.weights import ACTIVATION_BYTES, NORM_BYTES, weights

__all__ = ("NORM_BYTES", "WeightBytes", "weight_bytes", "kv_bytes_per_token", "model_summary", "PerfModel")


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes of a model in eq. 6-1 terms (per-layer figures are averages over layers).

    Attributes (bytes):
        attention_per_layer: dense GQA ``b·(2·H·QH·D + 2·H·KVH·D)`` (Q, O; K, V); any attention
            (MLA, linear) in general.
        ffn_per_layer: SwiGLU ``3·H·F·b``; for MoE every expert, shared expert and router.
        lm_head: ``V·H·b``.
        embedding: ``V·H·b`` unless tied to the LM head (then 0).
        norms: replicated norm weights (2 per layer, q/k norms, the final norm), 16-bit.
    """

    attention_per_layer: float
    ffn_per_layer: float
    lm_head: float
    embedding: float
    norms: float
    layers: int

    @property
    def per_layer(self) -> float:
        return self.attention_per_layer + self.ffn_per_layer

    @property
    def read_per_step(self) -> float:
        """Bytes of all layers and the LM head (a dense model streams all of it per decode step)."""
        return self.layers * self.per_layer + self.lm_head

    @property
    def resident(self) -> float:
        """Bytes held in memory: layers, LM head, embedding (if untied) and norms."""
        return self.read_per_step + self.embedding + self.norms


def weight_bytes(m: ModelSpec, bytes_per_param: float) -> WeightBytes:
    """Weight bytes of model ``m`` at ``bytes_per_param`` (2 for bf16), from :func:`optimizer.model.weights.weights`."""
    c = weights(m, bytes_per_param).component_bytes()
    attn = (c["attention"] + c["linear_attention"]) / m.layers
    ffn = (c["dense_ffn"] + c["routed_experts"] + c["shared_experts"] + c["router"]) / m.layers
    return WeightBytes(attn, ffn, c["lm_head"], c["embedding"], c["norms"], m.layers)


def kv_bytes_per_token(m: ModelSpec, bytes_per_elem: float) -> float:
    """KV cache bytes per token for the whole model: GQA ``2·L·KVH·D·b`` (K and V); MLA
    ``(kv_lora_rank + qk_rope_head_dim)·L·b``; linear-attention layers hold none."""
    return weights(m, bytes_per_elem, bytes_per_elem).kv_bytes_per_token


def model_summary(problem: Problem) -> dict:
    """The ``model`` block of the JSON report: params, weight_bytes, active_params_per_token,
    kv_bytes_per_token, state_bytes_per_session, max_context and components (see
    :meth:`optimizer.model.weights.Weights.as_dict`), at the instance's dtypes."""
    return weights(problem.model, problem.weight_bytes, problem.kv_bytes).as_dict()


class PerfModel:
    """Step time, service time and memory per GPU for the TP degrees of one problem."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.m = problem.model
        self.model = SharedPerfModel(problem.model, Hardware(problem.gpu, problem.server, problem.allreduce),
                                     problem.weight_bytes, problem.kv_bytes, problem.reserve_bytes,
                                     weight_dtype=problem.weight_dtype, kv_dtype=problem.kv_dtype,
                                     micro_batches=problem.micro_batches, contention_kappa=problem.contention_kappa)
        self.w = weight_bytes(self.m, problem.weight_bytes)
        self.kv_token = self.model.w.kv_bytes_per_token
        self.message_bytes = self.m.hidden * ACTIVATION_BYTES
        self.steps: DecodeSteps = decode_steps(self.model, self._source(problem), len(problem.sessions),
                                               self.min_positions)

    def _source(self, problem: Problem):
        """The instance's step-time source (``performance:``), None for the analytic roofline.

        Raises:
            InputError: under ``measured``, a GPU, engine version or model the database lacks."""
        perf = problem.performance
        if perf.source == "chapter" and perf.calibration is None:
            return None
        from optimizer.launch import MODEL_PLACEHOLDER
        from optimizer.model.steptimes import resolve

        hf_id = problem.hf_id if problem.hf_id != MODEL_PLACEHOLDER else None
        return resolve(perf, self.model, problem.config_file, problem.gpu_catalog or problem.gpu.name,
                       weight_dtype=problem.weight_dtype or "bf16", kv_dtype=problem.kv_dtype or "bf16", hf_id=hf_id)

    @property
    def min_positions(self) -> int:
        """The smallest ``position + 1`` any session is decoded at (``context + 1``)."""
        return min(c.context for c in self.problem.classes) + 1

    @property
    def max_positions(self) -> int:
        """The largest ``position + 1`` any session reaches (``context + new``): the range the
        step floors must hold over."""
        return max(c.context + c.new for c in self.problem.classes)

    @staticmethod
    def layout(p: int) -> Layout:
        """The layout of a TP-``p`` instance."""
        return Layout.tp(p)

    # ------------------------------------------------------------------ topology
    def spans_servers(self, p: int) -> bool:
        """True when a TP group of ``p`` GPUs does not fit in one server (uses scale-out)."""
        return self.model.hw.spans_servers(p)

    def kv_shards(self, p: int) -> int:
        """KV heads are split over at most KVH GPUs; TP beyond that replicates KV (MLA: 1)."""
        return self.model.kv_shards(Layout.tp(p))

    # ------------------------------------------------------------------ collectives
    def allreduce_s(self, p: int) -> float:
        """Time of one AllReduce of the ``H·2``-byte hidden vector in a TP-``p`` group (s);
        see :meth:`optimizer.model.hardware.Hardware.allreduce_source`."""
        return self.allreduce_source(p).time_s

    def allreduce_source(self, p: int) -> AllReduceSource:
        """Where a TP-``p`` group's AllReduce time comes from (nccl-tests log or alpha-beta model)
        and why; see :meth:`optimizer.model.hardware.Hardware.allreduce_source`."""
        return self.model.hw.allreduce_source(p, self.message_bytes)

    # ------------------------------------------------------------------ time
    def step_times_s(self, p: int, positions: np.ndarray) -> np.ndarray:
        """Decode step time of one session at context positions ``s``, seconds, shape like s, from
        the instance's step-time source (:attr:`steps`). Under the roofline (eqs. 6-2, 6-4, 6-5,
        6-8), dense: ``max(local, compute) + 2L·T_AR(p)`` with
        ``local = (weights_read/p + kv_token·(s+1)/min(p,KVH)) / HBM bandwidth`` and
        ``compute = (2·params_read + 4·QH·D·(s+1)·L) / p / peak``."""
        return self.steps.single_session_step_s(Layout.tp(p), positions)

    def step_time_s(self, p: int, position: int) -> float:
        return float(self.step_times_s(p, np.array([position]))[0])

    def batch_step_time_s(self, p: int, positions) -> float:
        """One batched decode step of the sessions at ``positions`` on a TP-``p`` instance (s)."""
        return float(self.steps.batch_steps_s(Layout.tp(p), positions, 1)[0])

    def service_time_s(self, p: int, context: int, new: int) -> float:
        """Time to run ``new`` decode steps at positions context .. context+new-1 (s)."""
        return float(self.step_times_s(p, np.arange(context, context + new)).sum())

    # ------------------------------------------------------------------ memory
    def static_bytes_per_gpu(self, p: int) -> float:
        """Weights per GPU plus the reserve (eq. 6-1): ``(resident - replicated)/p + replicated + reserve``,
        K/V projections held ``min(p, KVH)``-way split."""
        return self.model.static_bytes_per_gpu(Layout.tp(p))

    def kv_bytes_per_gpu(self, p: int, context: int, new: int) -> float:
        """KV bytes one session holds per GPU for the whole run: ``kv_token·(context+new)/min(p,KVH)``
        (+ linear-attention state / p)."""
        return self.model.kv_bytes_per_gpu(Layout.tp(p), context, new)

    def memory_per_gpu(self, p: int, sessions: list[tuple[int, int]]) -> float:
        """Bytes per GPU of a TP-``p`` instance holding ``sessions`` [(context, new), ...] (eq. 6-1)."""
        return self.static_bytes_per_gpu(p) + sum(self.kv_bytes_per_gpu(p, c, n) for c, n in sessions)

    def max_sessions(self, p: int, context: int, new: int) -> int:
        """How many identical sessions fit one TP-``p`` instance (0 if not even one)."""
        return self.model.max_sessions(Layout.tp(p), context, new)

    @cached_property
    def service_table_s(self) -> dict[tuple[int, int], float]:
        """Service time (s) per (degree, session class)."""
        return {(p, c.index): self.service_time_s(p, c.context, c.new)
                for p in self.problem.degrees for c in self.problem.classes}
