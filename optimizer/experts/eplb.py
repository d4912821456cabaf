"""Greedy baseline: DeepSeek EPLB's published balancing policy, re-implemented.

Source of the policy: DeepSeek, "Expert Parallelism Load Balancer (EPLB)",
https://github.com/deepseek-ai/eplb (README, 2025). Written here from its description:

* **Hierarchical** (used when the number of expert groups divides by the number of nodes):
  1. pack expert groups onto nodes, every node receiving the same number of groups
     (heaviest group first, onto the lightest node that still has room);
  2. inside each node, add redundant replicas one at a time to the expert with the largest
     load per replica;
  3. pack the node's replicas onto its GPUs, every GPU receiving the same number of replicas
     (heaviest replica first, onto the lightest GPU that still has room).
* **Global** (otherwise): the same policy with one group and one node.

Ties are broken towards the lower index everywhere (stable descending sort, first minimum,
first maximum), which reproduces the published example exactly
(``tests/test_experts_eplb.py``).

Conventions (EPLB's): ``phy2log[layer, r]`` is the logical expert held by physical replica
``r``; replica ``r`` lives on GPU ``r // slots_per_gpu``; ``logcnt[layer, e]`` is the number of
replicas of expert ``e``; ``log2phy[layer, e, k]`` lists the replicas of ``e`` padded with -1
to ``num_replicas - num_experts + 1`` columns.
"""
from __future__ import annotations

import heapq

import numpy as np


def balanced_packing(weights: np.ndarray, num_packs: int, capacities: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pack items into ``num_packs`` packs with fixed item counts, heaviest item first.

    Args:
        weights: ``[rows, items]`` item weights (any unit); each row is packed on its own.
        num_packs: number of packs; ``items`` must equal ``sum(capacities)``.
        capacities: items per pack (default: ``items // num_packs`` for every pack).
    Returns:
        ``(pack, rank)``, both ``[rows, items]`` int: the pack of each item and its position
        inside the pack (0-based, in packing order).
    """
    rows, items = weights.shape
    if capacities is None:
        if items % num_packs:
            raise ValueError(f"{items} items do not split evenly over {num_packs} packs")
        capacities = [items // num_packs] * num_packs
    if sum(capacities) != items:
        raise ValueError("capacities must add up to the number of items")
    pack = np.zeros((rows, items), dtype=np.int64)
    rank = np.zeros((rows, items), dtype=np.int64)
    for i in range(rows):
        order = np.argsort(-weights[i], kind="stable")
        used = [0] * num_packs
        # the lightest pack with room, the lowest index among equal loads: a heap of (load, pack)
        heap = [(0.0, p) for p in range(num_packs) if capacities[p] > 0]
        row = weights[i].tolist()
        for item in order.tolist():
            load, best = heapq.heappop(heap)
            pack[i, item] = best
            rank[i, item] = used[best]
            used[best] += 1
            if used[best] < capacities[best]:
                heapq.heappush(heap, (load + float(row[item]), best))
    return pack, rank


def replicate(weights: np.ndarray, num_replicas: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Give every expert one replica, then add replicas to the largest load per replica.

    Args:
        weights: ``[rows, experts]`` loads.
        num_replicas: replicas per row (>= experts).
    Returns:
        ``(rep2exp, rep_rank, count)``: ``[rows, num_replicas]`` expert of each replica,
        ``[rows, num_replicas]`` index of the replica among its expert's replicas, and
        ``[rows, experts]`` replica counts.
    """
    rows, experts = weights.shape
    rep2exp = np.tile(np.arange(num_replicas, dtype=np.int64), (rows, 1))
    rep_rank = np.zeros((rows, num_replicas), dtype=np.int64)
    count = np.ones((rows, experts), dtype=np.int64)
    w = weights.astype(np.float64)
    for r in range(experts, num_replicas):
        best = np.argmax(w / count, axis=1)
        rep2exp[:, r] = best
        rep_rank[:, r] = count[np.arange(rows), best]
        count[np.arange(rows), best] += 1
    return rep2exp, rep_rank, count


def _hierarchical(weights: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int,
                  num_gpus: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    layers, experts = weights.shape
    group_size = experts // num_groups
    experts_per_node = experts // num_nodes
    replicas_per_node = num_replicas // num_nodes
    gpus_per_node = num_gpus // num_nodes
    slots = num_replicas // num_gpus

    phy2log = np.zeros((layers, num_replicas), dtype=np.int64)
    phyrank = np.zeros((layers, num_replicas), dtype=np.int64)
    logcnt = np.zeros((layers, experts), dtype=np.int64)

    group_load = weights.reshape(layers, num_groups, group_size).sum(axis=2)
    gpack, grank = balanced_packing(group_load, num_nodes)
    for i in range(layers):
        # experts of node n, in the order: its groups by rank, members in id order
        node_experts = [[0] * experts_per_node for _ in range(num_nodes)]
        for g in range(num_groups):
            base = grank[i, g] * group_size
            for m in range(group_size):
                node_experts[gpack[i, g]][base + m] = g * group_size + m
        for n in range(num_nodes):
            members = np.array(node_experts[n], dtype=np.int64)
            w = weights[i, members][None, :].astype(np.float64)
            rep2local, rep_rank, cnt = replicate(w, replicas_per_node)
            per_rep = (w[0] / cnt[0])[rep2local[0]]
            gpu, pos = balanced_packing(per_rep[None, :], gpus_per_node)
            base = n * replicas_per_node
            for r in range(replicas_per_node):
                slot = base + gpu[0, r] * slots + pos[0, r]
                phy2log[i, slot] = members[rep2local[0, r]]
                phyrank[i, slot] = rep_rank[0, r]
            logcnt[i, members] = cnt[0]
    return phy2log, phyrank, logcnt


def rebalance(weights, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EPLB placement of ``num_replicas`` physical replicas for every layer.

    Args:
        weights: ``[layers, experts]`` token counts (any non-negative unit).
        num_replicas: physical replicas per layer, a multiple of ``num_gpus``.
        num_groups: expert groups (group-limited routing); hierarchical when it divides by
            ``num_nodes`` (and the experts divide by the groups), global otherwise.
        num_nodes: server nodes; ``num_gpus`` must divide by it.
        num_gpus: GPUs.
    Returns:
        ``(phy2log [layers, num_replicas], log2phy [layers, experts, num_replicas-experts+1],
        logcnt [layers, experts])``, int64, ``log2phy`` padded with -1.
    Raises:
        ValueError: the shapes do not fit (fewer replicas than experts, uneven GPUs).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError("weights must be [layers, experts]")
    layers, experts = w.shape
    if num_replicas < experts:
        raise ValueError(f"{num_replicas} replicas cannot hold {experts} experts")
    if num_replicas % num_gpus or num_gpus % num_nodes:
        raise ValueError("replicas must divide by GPUs and GPUs by nodes")
    hierarchical = (num_groups % num_nodes == 0 and experts % num_groups == 0
                    and num_replicas % num_nodes == 0)
    if hierarchical:
        phy2log, phyrank, logcnt = _hierarchical(w, num_replicas, num_groups, num_nodes, num_gpus)
    else:
        phy2log, phyrank, logcnt = _hierarchical(w, num_replicas, 1, 1, num_gpus)
    return phy2log, log2phy_from(phy2log, experts, phyrank), logcnt


def log2phy_from(phy2log: np.ndarray, num_experts: int, phyrank: np.ndarray | None = None) -> np.ndarray:
    """Inverse map ``[layers, experts, num_replicas - experts + 1]`` padded with -1.

    Replicas of an expert are listed by ``phyrank`` when given, else by replica index.
    """
    layers, num_replicas = phy2log.shape
    width = num_replicas - num_experts + 1
    out = np.full((layers, num_experts, width), -1, dtype=np.int64)
    for i in range(layers):
        filled = np.zeros(num_experts, dtype=np.int64)
        order = range(num_replicas) if phyrank is None else np.lexsort((np.arange(num_replicas), phyrank[i]))
        for r in order:
            e = phy2log[i, r]
            k = filled[e] if phyrank is None else phyrank[i, r]
            out[i, e, k] = r
            filled[e] += 1
    return out
