"""Family ``gpus_per_server[server s]``: the instances on a server use at most its GPUs.

Slots tied to servers: ``Σ_{slots k on s} gpus_k(s) · used_k ≤ G`` where ``gpus_k(s)`` is
p for a TP-p instance inside the server and G for an instance spanning whole servers.

Pooled slots (aggregate mode): integer counts ``n[p][s]`` of TP-p instances on server s
(p ≤ G) and Booleans ``span[p][s]`` (server s belongs to a TP-p instance spanning ``p/G``
whole servers), linked to the slots by ``Σ_s n[p][s] = Σ_i used[p][i]`` and
``Σ_s span[p][s] = (p/G) · Σ_i used[p][i]``; then
``Σ_p p · n[p][s] + G · Σ_p span[p][s] ≤ G``.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "gpus_per_server"


def define(f, problem) -> None:
    """Add the family's constraints to the formulation ``f`` of ``problem`` (see the module docstring)."""
    g = f.problem.server.gpus
    if f.pooled:
        _add_pooled(f, g)
        return
    for s in range(f.problem.servers):
        ks = f.slots_on_server(s)
        if not ks:
            continue
        f.nm.add(ConstraintKey(FAMILY, f"server {s}"), sum(k.gpus_each * f.used[k.index] for k in ks) <= g)


def _add_pooled(f, g: int) -> None:
    m = f.model
    degrees = sorted({k.degree for k in f.slots})
    f.server_count, f.server_span = {}, {}
    for p in degrees:
        used = sum(f.used[k.index] for k in f.slots if k.degree == p)
        for s in range(f.problem.servers):
            if p <= g:
                f.server_count[p, s] = m.new_int_var(0, g // p, f"n[tp{p},s{s}]")
            else:
                f.server_span[p, s] = m.new_bool_var(f"span[tp{p},s{s}]")
        if p <= g:
            m.add(sum(f.server_count[p, s] for s in range(f.problem.servers)) == used)
        else:
            m.add(sum(f.server_span[p, s] for s in range(f.problem.servers)) == (p // g) * used)
    f.server_usage = []
    for s in range(f.problem.servers):
        usage = sum(p * f.server_count[p, s] for p in degrees if p <= g) + \
            sum(g * f.server_span[p, s] for p in degrees if p > g)
        f.server_usage.append(usage)
        if degrees:
            f.nm.add(ConstraintKey(FAMILY, f"server {s}"), usage <= g)


def describe(key: ConstraintKey, f) -> str:
    return f"{key}: at most {f.problem.server.gpus} GPUs in instances"
