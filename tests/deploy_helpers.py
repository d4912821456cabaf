"""Helpers for deployment tests: instance dicts, a tiny model config, brute force."""
from __future__ import annotations

from objectives.deployment import get as get_objective

import copy
import itertools
import json
import random
from functools import lru_cache
from pathlib import Path

import yaml

from optimizer.deployment.batching import admission_order, batch_limits
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


def _valid_plans(problem, perf):
    """Every plan (deployment, GPU layout, assignment, order) the evaluator accepts, with its
    evaluation and its worst-scenario on-time count (tiny instances only)."""
    sessions = [s.id for s in problem.sessions]
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
                    if not ev.violations:
                        yield plan, ev, min([ev.nominal.on_time] + [r.on_time for r in ev.scenarios])


def brute_force(problem, objective: str):
    """Exhaustive optimum: every deployment, assignment and order (tiny instances only).

    Returns (best value, best Plan) or (None, None) when no plan is feasible.
    """
    floor = max(get_objective(objective).min_on_time, problem.required_on_time)
    best, best_plan = None, None
    for plan, ev, on in _valid_plans(problem, CachedPerf(problem)):
        if on < floor:
            continue
        v = ev.objective_value(objective)
        if best is None or v < best - 1e-12:
            best, best_plan = v, plan
    return best, best_plan


def brute_force_all(problem, objectives) -> dict:
    """:func:`brute_force`'s optimum of each of ``objectives`` in one enumeration of the plans:
    {objective: best value or None}."""
    floor = {o: max(get_objective(o).min_on_time, problem.required_on_time) for o in objectives}
    best = {o: None for o in objectives}
    for _, ev, on in _valid_plans(problem, CachedPerf(problem)):
        for o in objectives:
            if on < floor[o]:
                continue
            v = ev.objective_value(o)
            if best[o] is None or v < best[o] - 1e-12:
                best[o] = v
    return best


# ---------------------------------------------------------------------------- layouts and batching


def random_batched(seed: int, folder, deadlines=range(30, 300, 7)):
    rng = random.Random(seed)
    cfg = write_tiny_config(folder)
    gpus, servers = rng.choice([(2, 1), (4, 1), (2, 2)])
    sessions, total = [], 0
    for g in range(rng.randint(1, 2)):
        count = min(rng.randint(1, 3), 4 - total)
        if count <= 0:
            break
        total += count
        sessions.append({"name": f"g{g}", "count": count, "context_tokens": rng.randrange(5_000, 60_000, 1000),
                         "new_tokens": rng.randint(2, 6), "deadline_ms": rng.choice([None, *deadlines])})
    layouts = [{"attention": {"tp": 1}}, {"attention": {"tp": 2}}, {"attention": {"tp": 1}, "pp": 2},
               {"attention": {"tp": 1, "dp": 2}}]
    raw = {
        "name": f"batched {seed}", "model": {"config": str(cfg)},
        "hardware": {
            "gpu": {"name": "small", "memory_gb": rng.choice([0.2, 0.3, 0.5]), "memory_bandwidth_gb_s": 10.0,
                    "bf16_tflops": 50.0, "power_w": 300.0, "dollars_per_gpu_hour": 2.5},
            "server": {"name": "box", "gpus": gpus, "power_kw": 2.0,
                       "scale_up": {"bandwidth_gb_s": 50.0, "latency_us": 20.0},
                       "scale_out": {"bandwidth_gb_s": 5.0, "latency_us": 60.0}},
            "servers": servers},
        "workload": {"sessions": sessions, "min_on_time_fraction": rng.choice([0.0, 0.5, 1.0])},
        "deployment": {"reserve_gib_per_gpu": 0.01, "layouts": rng.sample(layouts, rng.randint(1, 4)),
                       "max_batch": rng.choice([2, 3, None])},
    }
    return build_problem(raw, folder / "batched.yaml")


def _place(problem, lays):
    """First-fit GPU ids for instances of these layouts (spanning ones on whole servers), or None."""
    G = problem.server.gpus
    free = {s: list(range(s * G, (s + 1) * G)) for s in range(problem.servers)}
    out = []
    for lay in sorted(lays, key=lambda l: -l.gpus):
        if lay.gpus > G:
            m = lay.gpus // G
            srv = [s for s in free if len(free[s]) == G][:m]
            if len(srv) < m:
                return None
            out.append((lay, tuple(srv), tuple(g for s in srv for g in free.pop(s))))
        else:
            s = next((s for s in free if len(free[s]) >= lay.gpus), None)
            if s is None:
                return None
            out.append((lay, (s,), tuple(free[s][:lay.gpus])))
            free[s] = free[s][lay.gpus:]
    return out


def brute_force_batched(problem, objective, most_on_time: bool = False):
    """Every multiset of instances (allowed layouts), assignment of sessions, batch limit per
    instance (1, powers of two, its session count; capped by max_batch) and admission order
    (every permutation at batch 1; earliest deadline first above), each plan re-checked by
    the independent evaluator."""
    from objectives.deployment import get
    perf = PerfModel(problem)
    obj = get(objective)
    by_id = {s.id: s for s in problem.sessions}
    ids = [s.id for s in problem.sessions]
    need = max(problem.required_on_time, obj.min_on_time)
    best = None
    most = None  # most sessions on time over valid plans, ignoring the requirement
    lays = [l for l in problem.layouts if l.gpus <= problem.total_gpus]
    for k in range(1, len(ids) + 1):
        for combo in itertools.combinations_with_replacement(lays, k):
            placed = _place(problem, combo)
            if placed is None:
                continue
            for assign in itertools.product(range(k), repeat=len(ids)):
                groups = [[sid for sid, a in zip(ids, assign) if a == i] for i in range(k)]
                if any(not g for g in groups):
                    continue
                choices = []
                for (lay, _, _), g in zip(placed, groups):
                    opts = []
                    for b in batch_limits(len(g), problem.batch_cap):
                        if b == 1:
                            opts += [(1, list(o)) for o in itertools.permutations(g)]
                        else:
                            jobs = [(by_id[s].context, by_id[s].new, by_id[s].deadline_s) for s in g]
                            opts.append((b, [g[i] for i in admission_order(jobs, [0] * len(g), b)]))
                    choices.append(opts)
                for pick in itertools.product(*choices):
                    plan = Plan([PlannedInstance(f"i{i}", lay.gpus, srv, gl, order, lay, b)
                                 for i, ((lay, srv, gl), (b, order)) in enumerate(zip(placed, pick))])
                    ev = evaluate(problem, plan, perf)
                    if ev.violations:
                        continue
                    most = ev.nominal.on_time if most is None else max(most, ev.nominal.on_time)
                    if ev.nominal.on_time < need:
                        continue
                    v = obj.value(ev)
                    if best is None or v < best - 1e-12:
                        best = v
    return most if most_on_time else best
