"""Serving family ``worker`` (and the per-configuration limits ``ttft``, ``tpot``, ``kv_memory``,
``kv_link``, ``weights``): a configuration that cannot meet the SLOs even alone at a rate near
zero gets no variable (``n_j = 0``, no row); its key names the limit, e.g.
``kv_link[prefill TP1 on h100-sxm]``. These keys make up the conflict when a role has no
usable configuration."""
from __future__ import annotations

from optimizer.result import ConstraintKey


def key(w, problem) -> ConstraintKey:
    return ConstraintKey(w.limit or "worker", w.label(problem))


def unusable(workers, role: str) -> list:
    """Configurations of ``role`` with no rate."""
    return [w for w in workers if w.role == role and w.rate <= 0]


def describe(k: ConstraintKey, data) -> str:
    """``"<label>: <why it has no rate>"`` for the unusable configuration ``k`` names
    (``data.unusable``).

    Raises:
        StopIteration: ``k`` names no unusable configuration of ``data``.
    """
    w = next(w for w in data.unusable if key(w, data.problem) == k)
    return f"{w.label(data.problem)}: {w.detail}"
