"""``serving.homogeneous: true``: at most one worker configuration per role, against exhaustive
search over single-configuration plans; named rows; refused by a day plan."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from objectives.serving import registry
from optimizer.serving.perf import ServingModel
from optimizer.serving.solve import solve_mode
from tests.conftest import assert_one_line_error
from tests.serving_helpers import llama8b_raw, problem


def _case(seed, homogeneous=True):
    rng = np.random.default_rng(seed)
    isl = int(rng.choice([1000, 4000, 8000]))
    raw = llama8b_raw(rate=float(rng.uniform(5, 60)), isl=isl, osl=int(rng.choice([100, 300])),
                      ttft_ms=float(rng.uniform(0.5, 2.0) * isl / 10), tpot_ms=float(rng.choice([10, 20, 40])),
                      servers=1, mode=str(rng.choice(["aggregated", "disaggregated"])))
    raw["serving"]["homogeneous"] = homogeneous
    p = problem(raw, "gpus")
    return p, ServingModel(p).workers()


def _brute_force(p, workers, mode, rate):
    """Fewest GPUs with one configuration per role (every pair of configurations and counts)."""
    roles = ("aggregated",) if mode == "aggregated" else ("prefill", "decode")
    pool = p.pools[0].count
    per_role = []
    for role in roles:
        opts = []
        for w in (w for w in workers if w.role == role and w.rate > 0):
            n = next((n for n in range(1, pool // w.gpus + 1) if w.capacity(n) >= rate * (1 - 1e-9)), None)
            if n is not None:
                opts.append(w.gpus * n)
        per_role.append(opts)
    best = None
    for combo in itertools.product(*per_role):
        if sum(combo) <= pool and (best is None or sum(combo) < best):
            best = sum(combo)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_homogeneous_plans_equal_exhaustive_search(seed):
    p, workers = _case(seed)
    mode, rate = p.mode, p.rates[0]
    res = solve_mode(p, workers, mode, registry()["gpus"], rate)
    want = _brute_force(p, workers, mode, rate)
    if want is None:
        assert res.counts is None
        return
    assert res.counts is not None and res.value == want
    for role in {workers[j].role for j in res.counts}:
        assert sum(1 for j in res.counts if workers[j].role == role) == 1


def test_the_option_changes_plans_in_some_random_case():
    """Not vacuous: in some random case the unrestricted plan mixes configurations of a role and
    needs fewer GPUs than the homogeneous one."""
    fewer = 0
    for seed in range(12):
        p, workers = _case(seed, homogeneous=False)
        res = solve_mode(p, workers, p.mode, registry()["gpus"], p.rates[0])
        if res.counts is None:
            continue
        roles = [workers[j].role for j in res.counts]
        if len(roles) > len(set(roles)):
            ph, wh = _case(seed)
            got = solve_mode(ph, wh, ph.mode, registry()["gpus"], ph.rates[0])
            fewer += got.counts is None or got.value > res.value
    assert fewer >= 1


def test_rows_are_named_by_configuration_and_role():
    from optimizer.serving import PIPELINE

    raw = llama8b_raw(rate=20.0, isl=2000, osl=200, ttft_ms=500, tpot_ms=20, servers=1, mode="both")
    raw["serving"]["homogeneous"] = True
    milps = PIPELINE.build(problem(raw))
    names = list(milps["disaggregated"].h.getLp().row_names_)
    assert "homogeneous[prefill]" in names and "homogeneous[decode]" in names
    assert any(n.startswith("homogeneous[decode TP") for n in names)
    assert "homogeneous[aggregated]" in list(milps["aggregated"].h.getLp().row_names_)


def test_a_day_plan_refuses_it(cli, tmp_path):
    import yaml

    from tests.conftest import INSTANCES

    raw = yaml.safe_load((INSTANCES / "serving_llama70b_day_windows.yaml").read_text())
    raw["serving"]["homogeneous"] = True
    path = tmp_path / "day.yaml"
    raw["model"]["config"] = str(INSTANCES / raw["model"]["config"])
    path.write_text(yaml.safe_dump(raw))
    assert_one_line_error(cli(path), "serving.homogeneous", "day plan")


def test_a_day_plan_refuses_a_closed_loop_start(cli, tmp_path):
    import yaml

    from tests.conftest import INSTANCES

    raw = yaml.safe_load((INSTANCES / "serving_llama70b_day_windows.yaml").read_text())
    raw["serving"]["traffic"]["start"] = "staggered"
    raw["model"]["config"] = str(INSTANCES / raw["model"]["config"])
    path = tmp_path / "day.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert_one_line_error(cli(path), "serving.traffic.start", "closed-loop")
