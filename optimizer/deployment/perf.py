"""Analytic performance model of dense-decoder inference (reference chapter, eqs. 6-1 to 6-10).

Pure functions of a resolved :class:`~optimizer.deployment.schema.Problem`; no solver
imports. Units: bytes, seconds, FLOP. Symbols: H hidden, QH query heads, KVH KV heads,
D head dim, F FFN size, L layers, V vocabulary, p TP degree, s context position.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from optimizer.deployment.collectives import ACTIVATION_BYTES, AllReduceSource, ring_allreduce_s, tree_allreduce_s
from optimizer.deployment.model_config import ModelShape
from optimizer.deployment.schema import Problem

NORM_BYTES = 2.0  # norm weights stay in 16 bits even in quantised checkpoints


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes of a dense decoder (eq. 6-1 terms).

    Attributes (bytes):
        attention_per_layer: ``2·(2·H·QH·D + 2·H·KVH·D)`` at 2 B/param, scaled by the weight dtype
            (Q and O projections H×QH·D, K and V projections H×KVH·D).
        ffn_per_layer: ``3·H·F·b`` (SwiGLU gate, up, down).
        lm_head: ``V·H·b``.
        embedding: ``V·H·b`` unless tied to the LM head (then 0).
        norms: replicated norm weights (2 per layer, plus q/k norms for Qwen3, plus the final norm).
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
        """Bytes streamed from HBM per decode step: all layers and the LM head (not the embedding)."""
        return self.layers * self.per_layer + self.lm_head

    @property
    def resident(self) -> float:
        """Bytes held in memory: layers, LM head, embedding (if untied) and norms."""
        return self.read_per_step + self.embedding + self.norms


def weight_bytes(m: ModelShape, bytes_per_param: float) -> WeightBytes:
    """Weight bytes of model ``m`` at ``bytes_per_param`` (2 for bf16). See :class:`WeightBytes`."""
    b = bytes_per_param
    attn = b * (2 * m.hidden * m.q_heads * m.head_dim + 2 * m.hidden * m.kv_heads * m.head_dim)
    ffn = 3 * m.hidden * m.ffn * b
    lm = m.vocab * m.hidden * b
    emb = 0.0 if m.tied_embeddings else lm
    norm_params = m.layers * (2 * m.hidden + (2 * m.head_dim if m.qk_norm else 0)) + m.hidden
    return WeightBytes(attn, ffn, lm, emb, norm_params * NORM_BYTES, m.layers)


def kv_bytes_per_token(m: ModelShape, bytes_per_elem: float) -> float:
    """KV cache bytes per token for the whole model: ``2·L·KVH·D·b`` (K and V)."""
    return 2 * m.layers * m.kv_heads * m.head_dim * bytes_per_elem


class PerfModel:
    """Step time, service time and memory per GPU for the TP degrees of one problem."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.m = problem.model
        self.w = weight_bytes(self.m, problem.weight_bytes)
        self.kv_token = kv_bytes_per_token(self.m, problem.kv_bytes)
        self.message_bytes = self.m.hidden * ACTIVATION_BYTES

    # ------------------------------------------------------------------ topology
    def spans_servers(self, p: int) -> bool:
        """True when a TP group of ``p`` GPUs does not fit in one server (uses scale-out)."""
        return p > self.problem.server.gpus

    def kv_shards(self, p: int) -> int:
        """KV heads are split over at most KVH GPUs; TP beyond that replicates KV."""
        return min(p, self.m.kv_heads)

    # ------------------------------------------------------------------ collectives
    def allreduce_s(self, p: int) -> float:
        """Time of one AllReduce of the ``H·2``-byte hidden vector in a TP-``p`` group (s).

        See :meth:`allreduce_source` for which table or formula gives it.
        """
        return self.allreduce_source(p).time_s

    def allreduce_source(self, p: int) -> AllReduceSource:
        """The AllReduce time of a TP-``p`` group with its source and the reason for it.

        ring (eq. 6-9), tree (eq. 6-10), best = the faster; ``measured``, and any group that
        spans servers when an ``allreduce_log`` is given, uses the nccl-tests out-of-place time
        of the smallest size >= M, for groups with that table's rank count (alpha-beta ring
        otherwise). Groups that span servers use the scale-out tier.
        """
        if p <= 1:
            return AllReduceSource(p, "none", "", "", 0.0, f"TP{p} has no AllReduce")
        srv = self.problem.server
        spans = self.spans_servers(p)
        tier = "scale_out" if spans else "scale_up"
        link = srv.scale_out if spans else srv.scale_up
        mode = self.problem.allreduce
        table = link.table
        log = str(table.path) if table is not None else None
        ranks = table.ranks if table is not None else None
        wants_log = mode == "measured" or spans
        if table is not None and wants_log and table.ranks == p:
            why = ("allreduce: measured" if mode == "measured"
                   else f"TP{p} spans servers: the scale_out log is used in every mode")
            return AllReduceSource(p, "log", "measured", tier, table.time_for(self.message_bytes),
                                   f"{why}; log has {table.ranks} ranks", log, ranks)
        ring = ring_allreduce_s(p, self.message_bytes, link.alpha_s, link.bandwidth_bytes_per_s)
        tree = tree_allreduce_s(p, self.message_bytes, link.alpha_s, link.bandwidth_bytes_per_s)
        if table is not None and wants_log:
            why = f"log has {table.ranks} ranks, TP{p} needs {p}"
        elif table is not None:
            why = f"allreduce: {mode}; the {tier} log is used only with allreduce: measured"
        elif mode == "measured":
            why = f"no allreduce_log on {tier}"
        else:
            why = f"allreduce: {mode}"
        if mode == "tree":
            return AllReduceSource(p, "model", "tree", tier, tree, why, log, ranks)
        if mode == "best":
            algo = "tree" if tree < ring else "ring"
            why += f" (tree {tree * 1e6:.2f} us, ring {ring * 1e6:.2f} us)"
            return AllReduceSource(p, "model", algo, tier, min(ring, tree), why, log, ranks)
        return AllReduceSource(p, "model", "ring", tier, ring, why, log, ranks)

    # ------------------------------------------------------------------ time
    def step_times_s(self, p: int, positions: np.ndarray) -> np.ndarray:
        """Decode step time at context positions ``s`` (eqs. 6-2, 6-4, 6-5), seconds, shape like s.

        ``max(local, compute) + 2L·T_AR(p)`` with
        ``local = (weights_read/p + kv_token·(s+1)/min(p,KVH)) / HBM bandwidth`` and
        ``compute = (2·params_read + 4·QH·D·(s+1)·L) / p / peak``.
        """
        s1 = np.asarray(positions, dtype=np.float64) + 1.0
        g = self.problem.gpu
        local = (self.w.read_per_step / p + self.kv_token * s1 / self.kv_shards(p)) / g.hbm_bytes_per_s
        params_read = self.w.read_per_step / self.problem.weight_bytes
        compute = (2 * params_read + 4 * self.m.q_heads * self.m.head_dim * s1 * self.m.layers) / p / g.peak_flops
        return np.maximum(local, compute) + 2 * self.m.layers * self.allreduce_s(p)

    def step_time_s(self, p: int, position: int) -> float:
        return float(self.step_times_s(p, np.array([position]))[0])

    def service_time_s(self, p: int, context: int, new: int) -> float:
        """Time to run ``new`` decode steps at positions context .. context+new-1 (s)."""
        return float(self.step_times_s(p, np.arange(context, context + new)).sum())

    # ------------------------------------------------------------------ memory
    def static_bytes_per_gpu(self, p: int) -> float:
        """Weights per GPU plus the reserve: ``(resident - norms)/p + norms + reserve`` (eq. 6-1)."""
        return (self.w.resident - self.w.norms) / p + self.w.norms + self.problem.reserve_bytes

    def kv_bytes_per_gpu(self, p: int, context: int, new: int) -> float:
        """KV bytes one session holds per GPU for the whole run: ``kv_token·(context+new)/min(p,KVH)``."""
        return self.kv_token * (context + new) / self.kv_shards(p)

    def memory_per_gpu(self, p: int, sessions: list[tuple[int, int]]) -> float:
        """Bytes per GPU of a TP-``p`` instance holding ``sessions`` [(context, new), ...] (eq. 6-1)."""
        return self.static_bytes_per_gpu(p) + sum(self.kv_bytes_per_gpu(p, c, n) for c, n in sessions)

    def max_sessions(self, p: int, context: int, new: int) -> int:
        """How many identical sessions fit one TP-``p`` instance (0 if not even one)."""
        room = self.problem.gpu.memory_bytes - self.static_bytes_per_gpu(p)
        if room < 0:
            return 0
        return int(room // self.kv_bytes_per_gpu(p, context, new))

    @cached_property
    def service_table_s(self) -> dict[tuple[int, int], float]:
        """Service time (s) per (degree, session class)."""
        return {(p, c.index): self.service_time_s(p, c.context, c.new)
                for p in self.problem.degrees for c in self.problem.classes}
