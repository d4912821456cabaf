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

from optimizer.deployment.evaluate import Plan, PlannedInstance, evaluate
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import build_problem
from tests.conftest import with_changes

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO / "instances" / "qwen32b_128k.yaml"


def book_raw() -> dict:
    return yaml.safe_load(BOOK.read_text())


def with_inline_h100_like_gpu(raw: dict) -> dict:
    """``raw`` with an inline GPU the catalog and the measured database do not know (H100-like
    figures) in an inline 8-GPU server: no fitted efficiency, no measured runs, no error band."""
    raw["hardware"]["gpu"] = {"name": "mine", "memory_gb": 80, "memory_bandwidth_gb_s": 3350, "bf16_tflops": 989,
                              "power_w": 700}
    raw["hardware"]["server"] = {"name": "box", "gpus": 8, "power_kw": 10.0,
                                 "scale_up": {"bandwidth_gb_s": 450.0, "latency_us": 3.0},
                                 "scale_out": {"bandwidth_gb_s": 50.0, "latency_us": 10.0}}
    return raw


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


BATCHED_LAYOUTS = ({"attention": {"tp": 1}}, {"attention": {"tp": 2}}, {"attention": {"tp": 1}, "pp": 2},
                   {"attention": {"tp": 1, "dp": 2}})


def random_sessions(rng: random.Random, context: tuple[int, int], deadlines) -> list[dict]:
    """1-2 session groups of 1-3 sessions (4 at most), contexts in ``context`` (steps of 1,000
    tokens), 2-6 new tokens, a deadline from ``deadlines`` or none."""
    sessions, total = [], 0
    for g in range(rng.randint(1, 2)):
        count = min(rng.randint(1, 3), 4 - total)
        if count <= 0:
            break
        total += count
        sessions.append({"name": f"g{g}", "count": count, "context_tokens": rng.randrange(*context, 1000),
                         "new_tokens": rng.randint(2, 6), "deadline_ms": rng.choice([None, *deadlines])})
    return sessions


def random_batched(seed: int, folder, deadlines=range(30, 300, 7), cp: bool = False):
    """A small random batched instance; ``cp``: its layouts also include TP1xCP2 (context
    parallelism over 2 GPUs), after the same random draws."""
    rng = random.Random(seed)
    cfg = write_tiny_config(folder)
    gpus, servers = rng.choice([(2, 1), (4, 1), (2, 2)])
    sessions = random_sessions(rng, (5_000, 60_000), deadlines)
    layouts = list(BATCHED_LAYOUTS)
    raw = {
        "name": f"batched {seed}", "model": {"config": str(cfg)},
        "hardware": {
            "gpu": {"name": "small", "memory_gb": rng.choice([0.2, 0.3, 0.5]), "memory_bandwidth_gb_s": 10.0,
                    "bf16_tflops": 50.0, "power_w": 300.0, "dollars_per_gpu_hour": 2.5},
            "server": {"name": "box", "gpus": gpus, "power_kw": 2.0,
                       "scale_up": {"bandwidth_gb_s": 50.0, "latency_us": 20.0},
                       "scale_out": {"bandwidth_gb_s": 5.0, "latency_us": 60.0}},
            "servers": servers},
        "performance": {"source": "chapter"},
        "workload": {"sessions": sessions, "min_on_time_fraction": rng.choice([0.0, 0.5, 1.0])},
        "deployment": {"reserve_gib_per_gpu": 0.01, "layouts": rng.sample(layouts, rng.randint(1, 4)),
                       "max_batch": rng.choice([2, 3, None])},
    }
    if cp:
        raw["deployment"]["layouts"].append({"attention": {"tp": 1}, "cp": 2})
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


def _set_partitions(items: list):
    """Every partition of ``items`` into non-empty blocks (each partition once)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest):
        yield [[first]] + part
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]


def brute_force_batched(problem, objective, most_on_time: bool = False):
    """The exhaustive optimum over the whole batched decision space: every partition of the
    sessions into replicas, a layout per replica (GPUs placed first-fit), and for each replica
    every batch limit ``1 .. min(n, max_batch)`` and every admission order.

    Replica timelines come from the evaluator's own batched simulation
    (``optimizer.deployment.evaluate._batched_timeline``), memory from the evaluator's rule (the
    i-th session on DP rank i mod dp). Per (replica sessions, layout) only the options no other
    beats on (makespan, on-time count, finish sum) are combined: every deployment objective
    (``scenario_from_timings``) is monotone in those per replica. A plan's value is its
    objective over the scenario of its timings; the best plan is re-checked by the evaluator.
    Returns the optimum (None when no plan exists), or with ``most_on_time`` the most
    sessions on time over every valid plan."""
    from dataclasses import replace

    from optimizer.deployment.evaluate import _batched_timeline, scenario_from_timings

    perf = PerfModel(problem)
    obj = get_objective(objective)
    by_id = {s.id: s for s in problem.sessions}
    need = max(problem.required_on_time, obj.min_on_time)
    lays = [l for l in problem.layouts if l.gpus <= problem.total_gpus]
    cap = problem.max_batch or len(problem.sessions)
    mem_limit = problem.gpu.memory_bytes * (1 + 1e-12)
    options: dict = {}

    def block_options(block: tuple, lay):
        key = (block, lay)
        if key in options:
            return options[key]
        best: dict = {}
        for b in range(1, min(len(block), cap) + 1):
            for order in itertools.permutations(block):
                known = [by_id[s] for s in order]
                mem = perf.model.memory_per_gpu(lay, [(s.context, s.new) for s in known],
                                                [i % lay.attention_dp for i in range(len(known))])
                if mem > mem_limit:
                    continue
                inst = PlannedInstance("x", lay.gpus, (0,), tuple(range(lay.gpus)), list(order), lay, b)
                tl = _batched_timeline(perf, inst, by_id)
                k = (max(t.finish_s for t in tl), -sum(t.on_time for t in tl), sum(t.finish_s for t in tl))
                best.setdefault(k, (list(order), b, tl))
        keep = []
        for k in sorted(best):
            if not any(o[1] <= k[1] and o[2] <= k[2] for o in keep):
                keep.append(k)
        options[key] = [best[k] for k in keep]
        return options[key]

    best_value, best_plan, most = None, None, None
    for part in _set_partitions(list(by_id)):
        if len(part) > problem.total_gpus:
            continue
        for combo in itertools.product(lays, repeat=len(part)):
            if sum(l.gpus for l in combo) > problem.total_gpus:
                continue
            placed = _place(problem, combo)
            if placed is None:
                continue
            # _place sorts by GPUs (widest first): pair each block with its layout's slot
            slots = {}
            for lay, srv, gl in placed:
                slots.setdefault(lay, []).append((srv, gl))
            per_block = [block_options(tuple(bl), lay) for bl, lay in zip(part, combo)]
            if any(not o for o in per_block):
                continue
            for pick in itertools.product(*per_block):
                used = {lay: 0 for lay in slots}
                insts = []
                timings = []
                for i, ((order, b, tl), lay) in enumerate(zip(pick, combo)):
                    srv, gl = slots[lay][used[lay]]
                    used[lay] += 1
                    insts.append(PlannedInstance(f"i{i}", lay.gpus, srv, gl, order, lay, b))
                    timings += [replace(t, instance=f"i{i}") for t in tl]  # the replica's own timeline
                plan = Plan(insts)
                sc = scenario_from_timings(problem, plan, timings)
                most = sc.on_time if most is None else max(most, sc.on_time)
                if sc.on_time < need:
                    continue
                v = obj.scenario_value(problem, sc)
                if best_value is None or v < best_value - 1e-12:
                    best_value, best_plan = v, plan
    if most_on_time:
        return most
    if best_plan is not None:
        ev = evaluate(problem, best_plan, perf)
        assert not ev.violations, ev.violations
        assert abs(obj.value(ev) - best_value) <= 1e-9 * max(1.0, abs(best_value)), (obj.value(ev), best_value)
    return best_value


def random_orders_instance(seed: int, folder):
    """A random small batched instance where admission order matters: 3-6 sessions, each its
    own (context, new tokens, deadline), 1-2 servers, 2-4 layouts, batch limit 2-4; deadlines
    drawn around the sessions' single-session times so that some but not all orders work."""
    rng = random.Random(seed)
    cfg = write_tiny_config(folder)
    gpus, servers = rng.choice([(2, 1), (4, 1), (2, 2)])
    n = rng.choice([3, 4, 4, 5, 5, 6])
    sessions = []
    for i in range(n):
        ctx = rng.randrange(2_000, 40_000, 1000)
        new = rng.randint(2, 8)
        sessions.append({"name": f"s{i}", "count": 1, "context_tokens": ctx, "new_tokens": new,
                         "deadline_ms": rng.choice([None, round(rng.uniform(10, 160), 1)])})
    layouts = [{"attention": {"tp": 1}}, {"attention": {"tp": 2}}, {"attention": {"tp": 1}, "pp": 2},
               {"attention": {"tp": 1, "dp": 2}}]
    raw = {
        "name": f"orders {seed}", "model": {"config": str(cfg)},
        "hardware": {
            "gpu": {"name": "small", "memory_gb": rng.choice([0.3, 0.5]), "memory_bandwidth_gb_s": 10.0,
                    "bf16_tflops": 50.0, "power_w": 300.0, "dollars_per_gpu_hour": 2.5},
            "server": {"name": "box", "gpus": gpus, "power_kw": 2.0,
                       "scale_up": {"bandwidth_gb_s": 50.0, "latency_us": 20.0},
                       "scale_out": {"bandwidth_gb_s": 5.0, "latency_us": 60.0}},
            "servers": servers},
        "performance": {"source": "chapter"},
        "workload": {"sessions": sessions, "min_on_time_fraction": rng.choice([0.0, 0.5, 0.75, 1.0])},
        "deployment": {"reserve_gib_per_gpu": 0.01, "layouts": rng.sample(layouts, rng.randint(2, 4)),
                       "max_batch": rng.randint(2, 4)},
    }
    return build_problem(raw, folder / "orders.yaml")


def assert_solver_equals_brute_force(problem, objective, abs_tol: float = 1e-9):
    """The product's batched solve against :func:`brute_force_batched`: ``infeasible`` exactly when
    no plan exists, else ``optimal`` with a plan the evaluator accepts, equal to the exhaustive
    optimum within 1e-6 relative (and ``abs_tol``; the search counts time in 10 ns ticks, rounded
    up). Returns the outcome."""
    import pytest

    from optimizer.deployment.strategy import solve_deployment
    from optimizer.result import Status

    best = brute_force_batched(problem, objective)
    out = solve_deployment(problem, objective, time_limit_s=60)
    if best is None:
        assert out.status == Status.INFEASIBLE
        return out
    assert out.status == Status.OPTIMAL, (out.status, out.scope, out.notes)
    assert out.evaluation.violations == []
    assert out.value == pytest.approx(best, rel=1e-6, abs=abs_tol)
    return out
