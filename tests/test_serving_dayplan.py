"""Day plan (issue #27 item 2, optimizer/serving/dayplan.py): the MILP over windows against an
exhaustive enumeration, each row family's rows, bad input, the CLI, and the Azure conversation
trace acceptance (skipped without ../shared/data)."""
from __future__ import annotations

import itertools
import json
import math

import pytest

from tests.conftest import INSTANCES
from tests.serving_helpers import llama8b_raw, problem, write

MIX = [{"isl": 512, "osl": 64, "share": 0.5}, {"isl": 2048, "osl": 256, "share": 0.5}]


def day_raw(load_s: float = 0.0, uptime_min: float = 0.0, rates=(40, 150, 30), lengths=(60, 60, 60),
            tp=(1, 2), mode: str = "aggregated", simulate: bool = False) -> dict:
    """Llama-3.1-8B on one HGX H100 (8 GPUs), three windows; the last one with another lengths mix."""
    raw = llama8b_raw(1, 1024, 128, 1000, 50, servers=1, mode=mode)
    wins = [{"length_min": ln, "rate_rps": r, "isl": 1024, "osl": 128} for ln, r in zip(lengths, rates)]
    wins[-1] = {"length_min": lengths[-1], "rate_rps": rates[-1], "classes": [dict(c) for c in MIX]}
    raw["serving"]["traffic"] = {"windows": wins}
    for role in ("aggregated", "prefill", "decode"):
        raw["serving"][role] = {"tp": list(tp)}
    raw["serving"]["startup"] = {"load_s": load_s, "min_uptime_min": uptime_min}
    raw["serving"]["simulation"] = {"enabled": simulate, "requests": 300}
    return raw


def data_of(raw, mode="aggregated", static_plan=False, margins=None):
    from optimizer.serving.dayplan import day_data, window_workers

    p = problem(raw)
    ws, _, _ = window_workers(p, ("aggregated",) if mode == "aggregated" else ("prefill", "decode"))
    return day_data(p, [list(w) for w in ws], mode, margins, static_plan)


def gpus_objective():
    from objectives.serving import registry

    return registry()["gpus"]


def brute_force(d) -> float:
    """The cheapest schedule by enumeration: every count of every configuration in every window
    (up to a whole pool), starts ``max(0, n_w - n_{w-1})`` (fewer cannot hold, more only cost and
    tighten the up-time), the up-time checked window by window."""
    from constraints.serving.uptime import started_within

    nw, nj = len(d.windows), len(d.labels)
    pool = d.problem.pools[0].count
    per_window = [c for c in itertools.product(*[range(pool // g + 1) for g in d.gpus])
                  if sum(g * n for g, n in zip(d.gpus, c)) <= pool]
    best = math.inf
    for sched in itertools.product(per_window, repeat=nw):
        ok = all(sum(d.rates[j][w] * sched[w][j] for j in range(nj)) >= d.required[w] - 1e-9 for w in range(nw))
        if not ok:
            continue
        starts = [[max(0, sched[w][j] - (sched[w - 1][j] if w else 0)) for j in range(nj)] for w in range(nw)]
        if any(sched[w][j] < sum(starts[v][j] for v in started_within(d, w)) for w in range(nw) for j in range(nj)):
            continue
        cost = sum(d.gpus[j] * sched[w][j] * d.windows[w].length_s / 3600 + d.gpus[j] * d.load_s[j] / 3600 * starts[w][j]
                   for w in range(nw) for j in range(nj))
        best = min(best, cost)
    return best


@pytest.mark.parametrize("load_s,uptime_min", [(0.0, 0.0), (900.0, 0.0), (1800.0, 0.0), (600.0, 120.0), (0.0, 180.0)])
def test_day_milp_matches_enumeration(load_s, uptime_min):
    from optimizer.serving.dayplan import solve_day

    d = data_of(day_raw(load_s, uptime_min))
    assert len(d.labels) == 2 and len(d.windows) == 3
    res = solve_day(d, gpus_objective(), 10.0)
    assert res.status.value == "optimal"
    assert res.value == pytest.approx(brute_force(d), rel=1e-6)
    assert res.gpu_hours == pytest.approx(res.value, rel=1e-9)  # the objective is the schedule's own cost
    assert res.bound <= res.value + 1e-9


def test_start_up_cost_and_up_time_change_the_schedule():
    """Free starts follow the load; an up-time as long as the day forbids stopping a worker (the
    counts never fall), which costs more than free starts and no more than the static plan."""
    from optimizer.serving.dayplan import solve_day

    free = solve_day(data_of(day_raw()), gpus_objective(), 10.0)
    gpus = [sum(n * (1 if j == 0 else 2) for j, n in c.items()) for c in free.counts]
    assert gpus[1] > gpus[0] and gpus[1] > gpus[2]  # the peak window has more GPUs up
    long = data_of(day_raw(0.0, 180.0))
    day = solve_day(long, gpus_objective(), 10.0)
    from dataclasses import replace

    static = solve_day(replace(long, static=True), gpus_objective(), 10.0)
    for j in long.index:
        ups = [c.get(j, 0) for c in day.counts]
        assert ups == sorted(ups)
    assert len({tuple(sorted(c.items())) for c in static.counts}) == 1
    assert free.value < day.value <= static.value + 1e-9


def rows(model):
    """``{row name: ({column name: coefficient}, lower, upper)}`` of a built model."""
    lp = model.h.getLp()
    cols = lp.col_names_
    a = lp.a_matrix_
    out = {name: ({}, lp.row_lower_[i], lp.row_upper_[i]) for i, name in enumerate(lp.row_names_)}
    names = lp.row_names_
    rowwise = a.format_ == a.format_.__class__.kRowwise
    for i in range(lp.num_row_ if rowwise else lp.num_col_):
        for k in range(a.start_[i], a.start_[i + 1]):
            row, col = (i, a.index_[k]) if rowwise else (a.index_[k], i)
            out[names[row]][0][cols[col]] = a.value_[k]
    return out


def test_family_rows_golden():
    from optimizer.serving.dayplan import build

    d = data_of(day_raw(600.0, 120.0), margins=(1.0, 1.25, 1.0))
    r = rows(build(d))
    t1, t2 = "aggregated TP1 on h100-sxm", "aggregated TP2 on h100-sxm"
    # capacity: rates of the window's mix, the margined rate
    coef, lo, hi = r["capacity[window 2, aggregated]"]
    assert coef == {f"n[{t1}]@w2": pytest.approx(d.rates[0][1]), f"n[{t2}]@w2": pytest.approx(d.rates[1][1])}
    assert lo == pytest.approx(150 * 1.25) and hi == math.inf
    assert d.rates[0][2] != d.rates[0][1]  # window 3's own mix gives other rates
    # startup: s[j,w] - n[j,w] + n[j,w-1] >= 0, cold start in window 1
    assert r[f"startup[window 1, n[{t1}]]"] == ({f"s[{t1}]@w1": 1.0, f"n[{t1}]@w1": -1.0}, 0.0, math.inf)
    assert r[f"startup[window 3, n[{t2}]]"] == ({f"s[{t2}]@w3": 1.0, f"n[{t2}]@w3": -1.0, f"n[{t2}]@w2": 1.0}, 0.0,
                                                  math.inf)
    # uptime 120 min over 60-min windows: the starts of this window and the one before
    assert r[f"uptime[window 3, n[{t1}]]"] == ({f"n[{t1}]@w3": 1.0, f"s[{t1}]@w2": -1.0, f"s[{t1}]@w3": -1.0}, 0.0,
                                                 math.inf)
    assert not any(k.startswith("uptime[window 1") for k in r)  # nothing started before window 1
    # gpus per window and pool, deploy per window and role
    assert r["gpus[window 2, pool h100-sxm]"] == ({f"n[{t1}]@w2": 1.0, f"n[{t2}]@w2": 2.0}, -math.inf, 8.0)
    assert r["deploy[window 1, aggregated]"] == ({f"n[{t1}]@w1": 1.0, f"n[{t2}]@w1": 1.0}, 1.0, math.inf)
    families = sorted({k.split("[")[0] for k in r})
    assert families == ["capacity", "deploy", "gpus", "startup", "uptime"]
    static_rows = rows(build(data_of(day_raw(600.0, 120.0), static_plan=True)))
    assert static_rows[f"static[window 3, n[{t2}]]"] == ({f"n[{t2}]@w3": 1.0, f"n[{t2}]@w1": -1.0}, 0.0, 0.0)


def test_no_uptime_rows_without_min_uptime_and_no_rows_for_an_empty_window():
    from optimizer.serving.dayplan import build

    r = rows(build(data_of(day_raw(0.0, 0.0, rates=(40, 0, 30)))))
    assert not any(k.startswith("uptime") for k in r)
    assert not any(k.startswith(("capacity[window 2", "deploy[window 2")) for k in r)
    assert "gpus[window 2, pool h100-sxm]" in r


def test_load_time_from_storage_bandwidth():
    from optimizer.serving.dayplan import day_data, window_workers

    raw = day_raw()
    raw["serving"]["startup"] = {"storage_gb_s": 2.0, "engine_start_s": 30}
    p = problem(raw)
    ws, _, _ = window_workers(p, ("aggregated",))
    d = day_data(p, [list(w) for w in ws], "aggregated")
    weights = p.pools[0].perf.weight_bytes_total(ws[0][d.index[0]].layout)
    assert 15e9 < weights < 17e9  # Llama-3.1-8B in BF16
    assert d.load_s[0] == pytest.approx(30 + weights / 2e9)


def test_disaggregated_day_plan_has_both_roles_in_every_served_window():
    from optimizer.serving.dayplan import solve_day

    d = data_of(day_raw(mode="disaggregated"), mode="disaggregated")
    res = solve_day(d, gpus_objective(), 10.0)
    assert res.counts is not None
    for w, c in enumerate(res.counts):
        roles = {d.roles_of[d.index.index(j)] for j in c}
        assert roles == {"prefill", "decode"}


def test_windows_beyond_the_pool_are_infeasible_and_named():
    from optimizer.serving.dayplan import solve_day

    d = data_of(day_raw(rates=(40, 5000, 30)))
    res = solve_day(d, gpus_objective(), 10.0)
    assert res.status.value == "infeasible"
    assert [str(k) for k in res.conflict] == ["capacity[window 2, aggregated]"]
    assert "window 2 needs 5e+03 req/s" in res.details[0]


def test_simulation_loop_accepts_a_plan_meeting_the_target_in_every_window():
    from optimizer.budget import Budget
    from optimizer.serving.dayplan import solve_day_problem

    sol = solve_day_problem(problem(day_raw(600.0, 60.0, rates=(4, 12, 3), simulate=True)), Budget.unlimited())
    best = sol.best
    assert best is not None and best.ok
    assert all(s.attainment >= sol.problem.attainment for s in best.sims)
    assert best.static is not None and best.static.value >= best.result.value - 1e-9


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("edit,field", [
    (lambda r: r["serving"]["traffic"]["windows"][1].update(length_min=0), "serving.traffic.windows[1].length_min"),
    (lambda r: r["serving"]["traffic"]["windows"][1].update(rate_rps=-1), "serving.traffic.windows[1].rate_rps"),
    (lambda r: r["serving"]["traffic"].update(window_min=5), "serving.traffic.window_min"),
    (lambda r: r["serving"]["traffic"].update(rate_rps=3), "serving.traffic.rate_rps"),
    (lambda r: r["serving"]["traffic"]["windows"][0].pop("isl"), "serving.traffic.windows[0]"),
    (lambda r: r["serving"]["traffic"]["windows"][0].pop("osl"), "serving.traffic.windows[0].osl"),
    (lambda r: r["serving"]["traffic"]["windows"][2]["classes"][0].update(share=0.2),
     "serving.traffic.windows[2].classes"),
    (lambda r: [w.update(rate_rps=0) for w in r["serving"]["traffic"]["windows"]], "serving.traffic.windows"),
    (lambda r: r["serving"].update(objective="goodput"), "serving.traffic.windows"),
    (lambda r: r["serving"]["startup"].update(storage_gb_s=2), "serving.startup.load_s"),
    (lambda r: r["serving"]["startup"].update(load_s=None, engine_start_s=5), "serving.startup.engine_start_s"),
    (lambda r: r["serving"]["startup"].update(min_uptime_min=-1), "serving.startup.min_uptime_min"),
])
def test_bad_day_plan_input_names_the_field(edit, field):
    from optimizer.errors import InputError

    raw = day_raw(600.0, 60.0)
    if raw["serving"]["startup"].get("load_s") is None:
        raw["serving"]["startup"].pop("load_s")
    edit(raw)
    raw["serving"]["startup"] = {k: v for k, v in raw["serving"]["startup"].items() if v is not None}
    with pytest.raises(InputError) as exc:
        problem(raw)
    assert field in exc.value.line(), exc.value.line()


def test_window_min_without_trace_and_startup_without_windows(tmp_path, cli):
    raw = llama8b_raw(1, 1024, 128, 1000, 50)
    raw["serving"]["traffic"]["window_min"] = 5
    r = cli(write(tmp_path, raw))
    assert r.exit_code == 2
    assert "serving.traffic.window_min: splits a trace" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    raw = llama8b_raw(1, 1024, 128, 1000, 50)
    raw["serving"]["startup"] = {"load_s": 60}
    r = cli(write(tmp_path, raw))
    assert r.exit_code == 2 and "serving.startup: applies to a day plan only" in r.stderr


def test_trace_split_into_windows(tmp_path):
    """A small trace: windows by arrival time, each window's rate its requests / length (the last
    window's length ends with the trace: 120 s to 130 s), its own arrivals (from 0) and mix."""
    from optimizer.serving import load_problem

    lines = ["arrival_s,input_tokens,output_tokens"]
    lines += [f"{t:.1f},{100 if t < 60 else 2000},50" for t in [0, 10, 20, 30, 50, 61, 62, 70, 130]]
    trace = tmp_path / "t.csv"
    trace.write_text("\n".join(lines) + "\n")
    raw = llama8b_raw(1, 1024, 128, 1000, 50)
    raw["serving"]["traffic"] = {"trace": str(trace), "window_min": 1}
    raw["model"]["config"] = str(INSTANCES / raw["model"]["config"])
    p = load_problem(raw, tmp_path / "i.yaml")
    assert [w.requests for w in p.windows] == [5, 3, 1]
    assert [w.rate for w in p.windows] == pytest.approx([5 / 60, 3 / 60, 1 / 10])
    assert [w.length_s for w in p.windows] == pytest.approx([60, 60, 10])
    assert list(p.windows[1].traffic.arrivals) == pytest.approx([0, 1, 9])
    assert p.windows[1].traffic.mean_isl == 2000 and p.windows[0].traffic.mean_isl == 100
    raw["serving"]["traffic"]["rate_rps"] = 2
    from optimizer.errors import InputError

    with pytest.raises(InputError, match="serving.traffic.rate_rps"):
        load_problem(raw, tmp_path / "i.yaml")


def test_cli_json_and_schedule_plot(tmp_path, cli):
    path = write(tmp_path, day_raw(600.0, 60.0, rates=(4, 12, 3), mode="both", simulate=True))
    r = cli(path, "--format", "json", "--plot", tmp_path / "plots")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    plan = d["plan"]
    assert plan["kind"] == "day_plan" and set(plan["modes"]) == {"aggregated", "disaggregated"}
    best = plan["modes"][plan["best_mode"]]
    assert d["objective"]["value"] == pytest.approx(min(m["objective"] for m in plan["modes"].values()))
    assert d["objective"]["unit"] == "GPU-hours" and best["gpu_hours"] == pytest.approx(best["objective"])
    assert [w["window"] for w in best["windows"]] == [1, 2, 3]
    assert all(w["attainment"] >= 0.9 for w in best["windows"])
    assert plan["saving"] == pytest.approx(1 - best["gpu_hours"] / best["static"]["gpu_hours"])
    for k in ("status", "objective", "bound", "gap", "time_s"):
        assert k in best["solver"]
    assert [f.rsplit("/", 1)[-1] for f in d["files"]] == ["schedule.png"]
    t = cli(path)
    assert t.exit_code == 0 and "schedule" in t.stdout and "static plan sized for the peak window" in t.stdout


# ----------------------------------------------------------------------------- acceptance
def test_azure_conversation_day_plan():
    """instances/serving_azure_conv_day.yaml: 12 five-minute windows of the Azure conversation trace
    (19,366 requests), Llama-3.1-70B on HGX H100, TTFT 1 s / TPOT 50 ms p90 at 0.9. The plan is
    within 1% of the MILP's bound, every window's simulated attainment meets the target, and the
    saving against the static peak plan is stated (the time: benchmarks/bench_dayplan.py)."""
    from tests.conftest import shared

    shared("serving", "azure-llm-2023", "AzureLLMInferenceTrace_conv.csv")
    import yaml

    from optimizer.budget import Budget
    from optimizer.serving import PIPELINE

    path = INSTANCES / "serving_azure_conv_day.yaml"
    p = PIPELINE.load(yaml.safe_load(path.read_text()), path)
    assert len(p.windows) == 12 and sum(w.requests for w in p.windows) == 19366
    report = PIPELINE.report(p, PIPELINE.solve(p, Budget.unlimited()), None)
    d = report.to_dict()
    assert d["status"] in ("optimal", "feasible")
    plan = d["plan"]
    for m in plan["modes"].values():
        assert m["gap"] <= 0.01 and m["gpu_hours"] <= m["bound"] * 1.01 + 1e-9
        assert all(w["attainment"] >= 0.9 for w in m["windows"])
        assert m["static"]["gpu_hours"] >= m["gpu_hours"] - 1e-9 and m["saving"] is not None
    assert plan["saving"] is not None and plan["static_gpu_hours"] >= plan["gpu_hours"] - 1e-9


def test_a_time_limit_that_cuts_the_simulations_is_not_called_optimal(cli):
    """At --time-limit 2 the windows' simulations are cut: the status said optimal with no word
    but a per-window note; now it is feasible and solver.cut_short names the windows."""
    import json as _json

    from tests.conftest import shared

    shared("serving", "azure-llm-2023", "AzureLLMInferenceTrace_conv.csv")
    r = cli(INSTANCES / "serving_azure_conv_day.yaml", "--time-limit", "1", "--format", "json")
    assert r.exit_code == 0, r.output
    d = _json.loads(r.stdout)
    cut = d["solver"].get("cut_short") or []
    sims = [w.get("simulation_note") or "" for w in d["plan"]["modes"][d["plan"]["best_mode"]]["windows"]]
    n_cut = sum(n.startswith("simulation cut") for n in sims)
    assert n_cut and d["solver"]["unchecked_windows"] == n_cut  # 1 s cannot simulate 12 windows
    assert any(line.startswith(f"{n_cut} of 12 windows") for line in cut)
    assert d["status"] == "feasible"


def test_window_models_past_their_share_of_the_limit_take_the_day_mix():
    """3-second windows of the Azure trace (1,168 of them, each its own lengths mix) modelled for
    ~200 s against a 20 s limit (issue #25 item 6): past MODEL_SHARE of the budget the remaining
    windows take the whole day's mix, said in solver.cut_short, and the plan is not optimal."""
    import time

    import yaml

    from optimizer.budget import Budget
    from optimizer.result import Status
    from optimizer.serving import PIPELINE
    from optimizer.serving.dayplan import MODEL_SHARE, solve_day_problem
    from tests.conftest import shared

    shared("serving", "azure-llm-2023", "AzureLLMInferenceTrace_conv.csv")
    path = INSTANCES / "serving_azure_conv_day.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["serving"]["traffic"]["window_min"] = 0.25
    p = PIPELINE.load(raw, path)
    t0 = time.perf_counter()
    sol = solve_day_problem(p, Budget.seconds(4.0), simulate_plans=False)
    assert sol.model_s <= MODEL_SHARE * 4.0 + 1.0  # one model past the deadline, then the day's
    assert 0 < sol.pooled_windows < len(p.windows)
    assert sol.distinct_mixes + sol.pooled_windows <= len(p.windows) + 1
    assert sol.status != Status.OPTIMAL and time.perf_counter() - t0 < 4.0 * 1.1 + 2.0
    d = PIPELINE.report(p, sol, None).to_dict()
    assert d["solver"]["pooled_windows"] == sol.pooled_windows
    assert any("whole day's lengths mix" in line for line in d["solver"]["cut_short"])


def test_windows_shorter_than_a_request_warn(cli, tmp_path):
    """Windows shorter than a request's lifetime at the SLO were accepted silently (3-second windows
    reported fewer GPU-hours than 5-minute ones: requests are not carried across windows)."""
    r = cli(write(tmp_path, day_raw(lengths=(0.05, 0.05, 0.05)), "short.yaml"), "--format", "json")
    assert r.exit_code == 0 and "shorter than a request's lifetime" in r.stderr
    r = cli(write(tmp_path, day_raw(), "long.yaml"), "--format", "json")
    assert r.exit_code == 0 and "shorter than a request's lifetime" not in r.stderr
