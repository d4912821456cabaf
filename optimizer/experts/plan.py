"""Placement plans and their independent evaluation.

A plan for one layer is ``X[e, g]`` (replicas of logical expert ``e`` on GPU ``g``) and
``F[e, g]`` (share of expert ``e``'s tokens computed on GPU ``g``; rows sum to 1). The even
split of EPLB/SGLang/vLLM gives ``F = X / X.sum(1)``. Load of GPU ``g`` (tokens):
``sum_e w[e] * F[e, g]``; balancedness = mean / max GPU load (the metric vLLM and SGLang log).
Replica ``r`` of an EPLB ``phy2log`` row lives on GPU ``gpu_of_replica[r]`` (``r // slots``
for equal slots).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class LayerPlan:
    """One layer's placement.

    Attributes:
        X: ``[experts, gpus]`` int replica counts (0/1 for plans that keep replicas of an
            expert on distinct GPUs).
        F: ``[experts, gpus]`` float share of each expert's tokens per GPU.
    """

    X: np.ndarray
    F: np.ndarray

    @staticmethod
    def even(X: np.ndarray) -> "LayerPlan":
        X = np.asarray(X, dtype=np.int64)
        cnt = X.sum(axis=1, keepdims=True)
        return LayerPlan(X, X / np.maximum(cnt, 1))

    @property
    def counts(self) -> np.ndarray:
        return self.X.sum(axis=1)

    def loads(self, w: np.ndarray) -> np.ndarray:
        """GPU loads ``[gpus]`` (tokens) for expert loads ``w [experts]``."""
        return np.asarray(w, dtype=np.float64) @ self.F

    def phy2log(self, slots: list[int]) -> np.ndarray:
        """EPLB ``phy2log`` row: GPU by GPU, its experts in increasing id (repeats kept)."""
        row = []
        for g, s in enumerate(slots):
            ids = np.repeat(np.arange(self.X.shape[0]), self.X[:, g])
            if len(ids) != s:
                raise ValueError(f"GPU {g} holds {len(ids)} replicas, expected {s}")
            row.extend(int(i) for i in ids)
        return np.array(row, dtype=np.int64)

    def replica_shares(self, slots: list[int]) -> np.ndarray:
        """Share of its expert's tokens for every physical replica (aligned with phy2log)."""
        out = []
        for g in range(len(slots)):
            for e in np.repeat(np.arange(self.X.shape[0]), self.X[:, g]):
                out.append(float(self.F[e, g] / self.X[e, g]))
        return np.array(out)


def gpu_of_replica(slots: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(slots)), slots)


def plan_from_phy2log(row, num_experts: int, slots: list[int]) -> LayerPlan:
    """Even-split plan from one ``phy2log`` row."""
    X = np.zeros((num_experts, len(slots)), dtype=np.int64)
    np.add.at(X, (np.asarray(row), gpu_of_replica(slots)), 1)
    return LayerPlan.even(X)


def trivial_plan(num_experts: int, slots: list[int]) -> LayerPlan:
    """SGLang's trivial location: physical replica ``r`` holds expert ``r % num_experts``."""
    R = int(sum(slots))
    return plan_from_phy2log(np.arange(R) % num_experts, num_experts, slots)


def moves(plan: LayerPlan, reference: LayerPlan | None) -> int | None:
    """Expert copies to load: (expert, GPU) pairs present in ``plan`` and not in ``reference``."""
    if reference is None:
        return None
    return int(((plan.X > 0) & (reference.X == 0)).sum())


def cross_node_tokens(plan: LayerPlan, w: np.ndarray, node_of_gpu: np.ndarray, num_nodes: int) -> float:
    """Tokens sent to another node under local-first dispatch.

    Model (documented assumption): each expert's tokens originate evenly across the nodes
    (data-parallel attention); a token is served on its own node when the expert has a
    replica there, otherwise it crosses nodes. Cross-node tokens of expert e =
    ``w[e] * (1 - nodes_with_e / num_nodes)``.
    """
    covered = np.zeros((plan.X.shape[0], num_nodes), dtype=bool)
    for g, n in enumerate(node_of_gpu):
        covered[:, n] |= plan.X[:, g] > 0
    return float((np.asarray(w, dtype=np.float64) * (1.0 - covered.sum(axis=1) / num_nodes)).sum())


def balancedness(loads: np.ndarray) -> float:
    """mean / max of GPU loads (1.0 for an all-zero layer)."""
    mx = float(np.max(loads))
    return 1.0 if mx <= 0 else float(np.mean(loads)) / mx


def apportion(w: np.ndarray, num_replicas: int, cap: int) -> np.ndarray:
    """Replica counts minimising the largest load per replica (one each, then the largest
    ``w/c`` gets the next, counts capped at ``cap``); ties to the lower id."""
    w = np.asarray(w, dtype=np.float64)
    c = np.ones(len(w), dtype=np.int64)
    for _ in range(num_replicas - len(w)):
        ratio = np.where(c < cap, w / c, -1.0)
        c[int(np.argmax(ratio))] += 1
    return c
