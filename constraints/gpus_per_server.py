"""Family ``gpus_per_server[server s]``: the instances on a server use at most its GPUs.

``Σ_{slots k on s} gpus_k(s) · used_k ≤ G`` where ``gpus_k(s)`` is p for a TP-p instance
inside the server and G for an instance spanning several whole servers.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "gpus_per_server"


def add(f) -> None:
    g = f.problem.server.gpus
    for s in range(f.problem.servers):
        ks = f.slots_on_server(s)
        if not ks:
            continue
        f.nm.add(ConstraintKey(FAMILY, f"server {s}"), sum(k.gpus_each * f.used[k.index] for k in ks) <= g)
