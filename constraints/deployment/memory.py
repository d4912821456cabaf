"""Family ``memory[instance k]``: KV cache of the instance's sessions fits each GPU (eq. 6-1).

``(resident − norms)/p + norms + reserve + Σ_sessions kv_token·(context+new)/min(p,KVH) ≤ memory``.
The static part is a constant per degree, so the constraint is
``Σ_c kv_bytes[p][c] · x[k][c] ≤ room_bytes[p]`` (bytes; KV rounded up, room rounded down).
Every session assigned to an instance keeps its KV resident for the whole run.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "memory"


def define(f, problem) -> None:
    """Add the family's constraints to the formulation ``f`` of ``problem`` (see the module docstring)."""
    xs = f.by_slot(f.x)
    for n, k in enumerate(f.slots):
        if n % 64 == 0:
            f.check_time()
        opt = f.options[k.degree]
        terms = [opt.kv_bytes[c] * x for c, x in xs.get(k.index, {}).items()]
        if terms:
            f.nm.add(ConstraintKey(FAMILY, k.label), sum(terms) <= opt.room_bytes)


def describe(key: ConstraintKey, f) -> str:
    """``memory[slot]``: the KV room of that replica's GPUs and how many sessions of each class it holds."""
    slots = {k.label: k for k in f.slots}
    k = slots.get(key.element)
    if k is None:
        return str(key)
    opt = f.options[k.degree]
    caps = ", ".join(f"{opt.cap[c.index]} of {c.session_ids[0].split('/')[0]}" for c in f.problem.classes)
    return f"{key}: a TP{k.degree} instance has {opt.room_bytes / 1e9:.2f} GB per GPU for KV cache (holds at most {caps})"
