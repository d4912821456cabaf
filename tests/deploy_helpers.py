"""Helpers for deployment tests: instance dicts, a tiny model config, brute force."""
from __future__ import annotations

from objectives.deployment import get as get_objective

import copy
import itertools
import json
from functools import lru_cache
from pathlib import Path

import yaml

from optimizer.deployment.evaluate import Plan, PlannedInstance, evaluate
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import build_problem
from tests.conftest import with_changes

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO / "instances" / "qwen32b_128k.yaml"


def book_raw() -> dict:
    return yaml.safe_load(BOOK.read_text())


def book_problem(**changes):
    return build_problem(with_changes(book_raw(), **changes), BOOK)


TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
    "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 2, "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False,
}


def write_tiny_config(folder: Path) -> Path:
    p = folder / "tiny.json"
    p.write_text(json.dumps(TINY_CONFIG))
    return p


class CachedPerf(PerfModel):
    """PerfModel with memoised service times (brute force evaluates many plans)."""

    @lru_cache(maxsize=None)
    def service_time_s(self, p, context, new):  # noqa: D102
        return super().service_time_s(p, context, new)


def _server_multisets(gpus: int, degrees):
    """All multisets of intra-server degrees with total <= gpus (as sorted tuples)."""
    small = sorted(d for d in degrees if d <= gpus)
    out = []

    def rec(start, left, acc):
        out.append(tuple(acc))
        for i in range(start, len(small)):
            d = small[i]
            if d <= left:
                rec(i, left - d, acc + [d])

    rec(0, gpus, [])
    return out


def deployments(problem):
    """Every way to place instances on the servers: list of [(degree, servers)]."""
    G, S = problem.server.gpus, problem.servers
    per_server = _server_multisets(G, problem.degrees)
    big = [d for d in problem.degrees if d > G and d % G == 0 and d <= G * S]
    results = []
    # choose how many whole servers go to each spanning degree (in aligned groups)
    span_choices = [[]]
    for d in big:
        m = d // G
        span_choices = [c + [d] * k for c in span_choices for k in range(0, S // m + 1)]
    for span in span_choices:
        used = sum(d // G for d in span)
        if used > S:
            continue
        rest = S - used
        layout, srv = [], 0
        for d in span:
            m = d // G
            layout.append((d, tuple(range(srv, srv + m))))
            srv += m
        for combo in itertools.product(per_server, repeat=rest):
            inst = list(layout)
            for j, ms in enumerate(combo):
                inst += [(d, (srv + j,)) for d in ms]
            if inst:
                results.append(inst)
    return results


def _gpu_layouts(problem, inst):
    """GPU lists for the instances; with faults naming a GPU, every choice of holder."""
    G = problem.server.gpus
    named = sorted({f.gpu for f in problem.faults if f.gpu is not None})
    base_free = {s: list(range(s * G, (s + 1) * G)) for s in range(problem.servers)}
    if not named:
        free = copy.deepcopy(base_free)
        gl = []
        for d, servers in inst:
            gs = []
            for s in servers:
                take = min(d, G)
                gs += free[s][:take]
                free[s] = free[s][take:]
            gl.append(tuple(gs))
        yield gl
        return
    # holder choice per named GPU: an instance index on its server or None (idle)
    options = []
    for g in named:
        s = g // G
        options.append([i for i, (_, servers) in enumerate(inst) if s in servers] + [None])
    for choice in itertools.product(*options):
        free = {s: [g for g in base_free[s] if g not in named] for s in base_free}
        gl, ok = [], True
        for i, (d, servers) in enumerate(inst):
            mine = [g for g, c in zip(named, choice) if c == i]
            gs = list(mine)
            for s in servers:
                need = min(d, G) - sum(1 for g in mine if g // G == s)
                if need < 0 or len(free[s]) < need:
                    ok = False
                    break
                gs += free[s][:need]
                free[s] = free[s][need:]
            if not ok:
                break
            gl.append(tuple(gs))
        if ok:
            yield gl


def brute_force(problem, objective: str):
    """Exhaustive optimum: every deployment, assignment and order (tiny instances only).

    Returns (best value, best Plan) or (None, None) when no plan is feasible.
    """
    perf = CachedPerf(problem)
    sessions = [s.id for s in problem.sessions]
    need = problem.required_on_time
    min_on = get_objective(objective).min_on_time
    best, best_plan = None, None
    for inst in deployments(problem):
        if len(inst) > len(sessions):
            continue
        for gl in _gpu_layouts(problem, inst):
            for assign in itertools.product(range(len(inst)), repeat=len(sessions)):
                groups = [[] for _ in inst]
                for sid, i in zip(sessions, assign):
                    groups[i].append(sid)
                if any(not g for g in groups):
                    continue
                for orders in itertools.product(*[list(itertools.permutations(g)) for g in groups]):
                    plan = Plan([PlannedInstance(f"i{i}", d, servers, gl[i], list(orders[i]))
                                 for i, (d, servers) in enumerate(inst)])
                    ev = evaluate(problem, plan, perf)
                    if ev.violations:
                        continue
                    if min([ev.nominal.on_time] + [r.on_time for r in ev.scenarios]) < max(min_on, need):
                        continue
                    v = ev.objective_value(objective)
                    if best is None or v < best - 1e-12:
                        best, best_plan = v, plan
    return best, best_plan
