"""Issue #39 point 1 (first part): serving workers that span servers. A MoE worker's attention-DP
ranks and EP groups spread over whole servers (All-to-All over the NICs, the fabric model), its TP
groups stay inside one server; ``estimate`` takes such fixed workers, the optimiser offers them
when ``serving.<role>.max_gpus`` exceeds a server, and the measured source says it has no
cross-server All-to-All rather than timing one."""
from __future__ import annotations

import json

import pytest

from optimizer.model.config import read_hf_config
from optimizer.model.hardware import hardware_from_catalog
from optimizer.model.layout import Layout, layout_problem, span_problem, spanning_layouts
from optimizer.model.perf import PerfModel
from tests.conftest import assert_one_line_error
from tests.serving_helpers import INSTANCES, write

DSV3 = INSTANCES / "models" / "deepseek-v3.json"


def _raw(workers, source="analytic", servers=12, **serving) -> dict:
    return {"name": "dsv3 wide ep", "model": {"config": str(DSV3), "hf_id": "deepseek-ai/DeepSeek-V3", "weight_dtype": "fp8"},
            "hardware": {"gpu": "h100-sxm", "server": "hgx-h100", "servers": servers},
            "serving": {"traffic": {"concurrency": 256, "isl": 2000, "osl": 64}, "slo": {"ttft_ms": 1e6, "tpot_ms": 1e6},
                        "fixed": {"workers": workers}, **serving},
            "performance": {"source": source, "engine": "sglang"}}


WIDE = [{"role": "prefill", "tp": 1, "dp": 32, "ep": 32, "count": 1}, {"role": "decode", "tp": 1, "dp": 64, "ep": 64, "count": 1}]


# ---------------------------------------------------------------- the rule, one place
def test_span_rule():
    assert span_problem(Layout(1, 8, 1, 8), 8) is None  # one server
    assert span_problem(Layout(1, 32, 1, 32), 8) is None  # DP32/EP32 over 4 servers
    assert span_problem(Layout(8, 4, 1, 32), 8) is None  # TP8 x DP4, EP32: each TP group in a server
    field, msg = span_problem(Layout.tp(16), 8)
    assert field == "tp" and "TP16 crosses the scale-up domain (8 GPUs per server)" in msg
    field, msg = span_problem(Layout(2, 8, 16, 1), 8)
    assert field == "tp" and "experts TP16" in msg
    field, msg = span_problem(Layout(4, 3, 1, 12), 8)  # 12 GPUs: not whole servers
    assert field == "gpus" and "whole servers (a multiple of 8)" in msg


def test_spanning_layouts_are_wide_ep_over_whole_servers():
    m = read_hf_config(DSV3)
    lays = spanning_layouts(m, 8, 32)
    assert {lay.gpus for lay in lays} == {16, 32}  # 24 GPUs: EP24 does not divide 256 experts
    for lay in lays:
        assert lay.experts_ep == lay.gpus and lay.experts_tp == 1 and lay.attention_tp <= 8
        assert layout_problem(m, lay) is None and span_problem(lay, 8) is None
    assert spanning_layouts(read_hf_config(INSTANCES / "models" / "qwen3-32b.json"), 8, 64) == []  # dense


def test_the_all_to_all_of_a_spanning_worker_crosses_the_nic():
    """EP32 over 4 servers: 24 of the 31 peers are on other servers, so dispatch/combine pays the
    NIC (50 GB/s per GPU) and takes longer than EP8 inside one server at the same tokens per GPU."""
    perf = PerfModel(read_hf_config(DSV3), hardware_from_catalog("h100-sxm", "hgx-h100"), 1.0, 2.0, 2 * 2**30)
    wide, narrow = Layout(1, 32, 1, 32), Layout(1, 8, 1, 8)
    a2a = {lay.gpus: perf.step(lay, [1000] * lay.attention_dp * 64).alltoall_s for lay in (wide, narrow)}
    assert a2a[32] > 2 * a2a[8] > 0


# ---------------------------------------------------------------- estimate
def test_estimate_takes_workers_that_span_servers(cli_any, tmp_path):
    r = cli_any("estimate", write(tmp_path, _raw(WIDE), "w.yaml"), "--format", "json")
    assert r.exit_code == 0, r.output
    est = json.loads(r.output[r.output.index("{"):])["plan"]["estimates"][0]
    assert sum(w["gpus"] for w in est["workers"]) == 96, est["workers"]
    assert est["figures"]["ttft_ms"]["mean"] > 0 and est["figures"]["tpot_ms"]["mean"] > 0


@pytest.mark.parametrize("worker, field, needles", [
    ({"role": "aggregated", "tp": 16, "count": 1}, "serving.fixed.workers[0].tp", ("TP16 crosses the scale-up domain",)),
    ({"role": "aggregated", "tp": 1, "dp": 128, "ep": 128, "count": 1}, "serving.fixed.workers",
     ("need 128 GPUs", "96")),
    ({"role": "aggregated", "tp": 1, "dp": 24, "ep": 24, "count": 1}, "serving.fixed.workers[0]",
     ("EP24 does not divide the 256 routed experts",)),
])
def test_bad_spanning_workers_one_line_each(cli_any, tmp_path, worker, field, needles):
    assert_one_line_error(cli_any("estimate", write(tmp_path, _raw([worker]), "b.yaml")), field, *needles)


def test_measured_source_does_not_time_a_cross_server_all_to_all(cli_any, tmp_path):
    """Under ``measured`` the spanning worker is refused with the reason (one line); under ``auto``
    it is timed by the analytic fabric model and the warning says why."""
    agg = [{"role": "aggregated", "tp": 1, "dp": 16, "ep": 16, "count": 1}]
    assert_one_line_error(cli_any("estimate", write(tmp_path, _raw(agg, "measured", servers=2), "m.yaml")),
                          "spans 2 servers", "of one node")
    r = cli_any("estimate", write(tmp_path, _raw(agg, "auto", servers=2), "a.yaml"))
    assert r.exit_code == 0, r.output
    assert "TP1xDP16/EP16 timed by the analytic roofline" in r.output and "spans 2 servers" in r.output


# ---------------------------------------------------------------- the optimiser's layouts
def test_max_gpus_above_a_server_offers_the_spans(tmp_path):
    from optimizer.serving import load_problem
    from optimizer.serving.perf import ServingModel

    raw = _raw(WIDE, servers=4)
    del raw["serving"]["fixed"]
    raw["serving"]["traffic"] = {"rate_rps": 5, "isl": 2000, "osl": 64}
    p = load_problem(raw, tmp_path / "x.yaml")
    m = ServingModel(p)
    assert max(lay.gpus for lay in m.layouts(p.pools[0], "decode")) == 8  # default: one server
    raw["serving"]["decode"] = {"max_gpus": 32}
    p = load_problem(raw, tmp_path / "x.yaml")
    lays = ServingModel(p).layouts(p.pools[0], "decode")
    assert {lay.gpus for lay in lays if lay.gpus > 8} == {16, 32}
    assert Layout(1, 32, 1, 32) in lays
