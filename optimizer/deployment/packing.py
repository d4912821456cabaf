"""Placing replicas on servers: spanning replicas on whole servers first, then first fit."""
from __future__ import annotations

from optimizer.deployment.evaluate import Plan, PlannedInstance
from optimizer.deployment.schema import Problem


def pack_on_servers(problem: Problem, items: list[tuple]) -> Plan:
    """Place instances (GPUs, ordered session ids[, layout, batch limit]) on servers: spanning
    instances on whole servers first, then first-fit by decreasing GPUs (exact for chain sizes)."""
    G = problem.server.gpus
    items = sorted(items, key=lambda t: -t[0])
    free = [G] * problem.servers
    out = []
    next_gpu = [s * G for s in range(problem.servers)]
    for item in items:
        p, order = item[0], item[1]
        lay, batch = (item[2], item[3]) if len(item) > 2 else (None, 1)
        if p > G:
            m = p // G
            start = next(s for s in range(problem.servers - m + 1) if all(free[t] == G for t in range(s, s + m)))
            servers = tuple(range(start, start + m))
            gpus = []
            for t in servers:
                gpus += list(range(next_gpu[t], next_gpu[t] + G))
                next_gpu[t] += G
                free[t] = 0
        else:
            s = next(s for s in range(problem.servers) if free[s] >= p)
            servers = (s,)
            gpus = list(range(next_gpu[s], next_gpu[s] + p))
            next_gpu[s] += p
            free[s] -= p
        out.append(PlannedInstance(f"i{len(out)}", p, servers, tuple(gpus), order, lay, batch))
    return Plan(out)
