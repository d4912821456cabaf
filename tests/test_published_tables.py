"""Published tables (issue #38): three rows of ``benchmarks/bench_published.py`` predicted again.

The errors asserted are the ones the benchmark measured on these rows with the default source
(``benchmarks/results/published.json``, docs/benchmarks.md "Published tables"), not the issue's
15% / 25% targets: one row meets them, two miss (the Qwen3-235B 5000/500 throughput by +33%; the
NIM Llama-3.3-70B 5000/500 row at 50 users by -24% throughput and 14x TTFT). Tolerance: 2 points
of relative error for throughput and TPOT, 5% of the predicted/published ratio for TTFT. Skips
without aiconfigurator-core (the measured kernel database and its model configs).
"""
from __future__ import annotations

import pytest

pytest.importorskip("aiconfigurator_core")

from benchmarks import bench_published as bp  # noqa: E402

# row id -> the relative errors (predicted / published - 1) the benchmark measured
MEASURED = {
    "trtllm-perf-overview-v1.0:Llama-3.1-8B:H100:TP1:1000/1000": {"throughput": -0.0699},
    "trtllm-perf-overview-v1.0:Qwen3-235B-A22B:H200:TP8:5000/500": {"throughput": 0.3310},
    "nim-llm-1.8.0:Llama-3.3-70B:H100:TP2:5000/500:c50": {"throughput": -0.2383, "tpot": -0.0753, "ttft": 13.288},
}


def _rows():
    for table in bp.load_tables():
        for r in table["rows"]:
            if bp.row_id(table, r) in MEASURED:
                yield table, r


def test_the_rows_are_in_the_data_file_with_their_sources():
    got = {bp.row_id(t, r) for t, r in _rows()}
    assert got == set(MEASURED)
    for t in bp.load_tables():
        assert t["source"].get("commit") or t["source"].get("version")


@pytest.mark.parametrize("rid", sorted(MEASURED))
def test_row_errors_as_measured(rid):
    table, r = next((t, r) for t, r in _rows() if bp.row_id(t, r) == rid)
    o = bp.run_row(table, r)
    assert "predicted" in o, o.get("skipped")
    assert o["predicted"]["source"] == "measured"
    for k, want in MEASURED[rid].items():
        got = o["error"][k]
        if k == "ttft":
            assert abs((1 + got) / (1 + want) - 1) <= 0.05, (k, got, want)
        else:
            assert abs(got - want) <= 0.02, (k, got, want)
    # the verdicts follow the targets: only the Llama-3.1-8B row meets them
    assert all(o["meets"].values()) == (rid.endswith("Llama-3.1-8B:H100:TP1:1000/1000"))


def test_moe_rows_report_the_other_reading_of_tp8():
    table, r = next((t, r) for t, r in _rows() if "Qwen3" in r["model"])
    o = bp.run_row(table, r)
    assert o["predicted"]["layout"] == "TP1xDP8/EP8"
    assert o["alternative"]["layout"] == "TP8"
