"""nccl-tests ``all_reduce_perf`` tables: parsing the real 2x8 H100 log, the measured AllReduce
time of a TP group that spans two servers (and its effect on the decode step), the alpha-beta
fallbacks, and malformed logs (exit 2, one line)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from optimizer.deployment import load, solve
from optimizer.deployment.collectives import read_nccl_allreduce_log, ring_allreduce_s
from optimizer.deployment.perf import PerfModel, weight_bytes
from optimizer.errors import InputError
from tests.conftest import INSTANCES, assert_one_line_error, shared

LOG = ("nccl", "hgx-h100-2x8-all_reduce_perf.txt")
QWEN32B = INSTANCES / "models" / "qwen3-32b.json"
M_BYTES = 5120 * 2  # Qwen3-32B hidden vector in bf16: the TP AllReduce message
CTX = 131064  # the book's 128K sessions
MEASURED_16384_S = 32.74e-6  # out-of-place time of the 16384 B row in the shared log

# hgx-h100 catalog figures (instances/hardware/catalog.yaml), written inline here so the
# scale-out tier can carry the measured table
SCALE_UP = {"bandwidth_gb_s": 450, "latency_us": 0.822}
SCALE_OUT = {"bandwidth_gb_s": 50, "latency_us": 3.76}


# ----------------------------------------------------------------------------- the real log


def test_real_log_parses():
    t = read_nccl_allreduce_log(shared(*LOG))
    assert t.ranks == 16
    assert len(t.size_bytes) == 32 and len(t.time_s) == 32 and len(t.busbw_gb_s) == 32
    assert t.size_bytes[0] == 8 and t.size_bytes[-1] == 17179869184
    i = list(t.size_bytes).index(16384)
    assert t.time_s[i] == pytest.approx(MEASURED_16384_S, rel=1e-12)
    assert t.busbw_gb_s[i] == pytest.approx(0.94)
    # first row: out-of-place 68.52 us (the in-place column, 24.70 us, must not be read)
    assert t.time_s[0] == pytest.approx(68.52e-6, rel=1e-12)


def test_time_for_picks_smallest_size_at_least_m():
    t = read_nccl_allreduce_log(shared(*LOG))
    assert t.time_for(M_BYTES) == pytest.approx(MEASURED_16384_S, rel=1e-12)  # 8192 < 10240 <= 16384
    assert t.time_for(16384) == pytest.approx(MEASURED_16384_S, rel=1e-12)  # exact size: that row
    assert t.time_for(16385) == pytest.approx(34.10e-6, rel=1e-12)  # next row
    assert t.time_for(1) == pytest.approx(68.52e-6, rel=1e-12)
    with pytest.raises(ValueError):
        t.time_for(17179869185)


# ----------------------------------------------------------------------------- instances


def _write_instance(tmp_path: Path, *, log: Path | None, degrees, allreduce: str = "ring", servers: int = 2,
                    scale_up_log: Path | None = None, count: int = 4, deadline_ms: float | None = 300,
                    fraction: float = 1.0) -> Path:
    scale_out = dict(SCALE_OUT)
    if log is not None:
        scale_out["allreduce_log"] = str(log)
    scale_up = dict(SCALE_UP)
    if scale_up_log is not None:
        scale_up["allreduce_log"] = str(scale_up_log)
    session = {"name": "chat", "count": count, "context_tokens": CTX, "new_tokens": 8}
    if deadline_ms is not None:
        session["deadline_ms"] = deadline_ms
    raw = {
        "name": "tp16 across two servers",
        "model": {"config": str(QWEN32B), "weight_dtype": "bf16", "kv_dtype": "bf16",
                  "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}},
        "hardware": {
            "gpu": "h100-sxm",
            "server": {"name": "hgx-h100-measured", "gpus": 8, "power_kw": 10.2,
                       "scale_up": scale_up, "scale_out": scale_out},
            "servers": servers,
        },
        "workload": {"sessions": [session], "min_on_time_fraction": fraction},
        "deployment": {"reserve_gib_per_gpu": 2, "tensor_parallel": list(degrees), "allreduce": allreduce},
    }
    p = tmp_path / "inst.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


def _max_local_compute_s(problem, p: int, s: int) -> float:
    """``max(local, compute)`` of eqs. 6-2/6-4 written out here, for Qwen3-32B on H100."""
    m = problem.model
    w = weight_bytes(m, 2.0)
    kv_token = 2 * m.layers * m.kv_heads * m.head_dim * 2.0
    local = (w.read_per_step / p + kv_token * (s + 1) / min(p, m.kv_heads)) / 3350e9
    compute = (2 * w.read_per_step / 2.0 + 4 * m.q_heads * m.head_dim * (s + 1) * m.layers) / p / 989.4e12
    return max(local, compute)


def _scale_out_ring16_s() -> float:
    return 2 * 15 * 3.76e-6 + 2 * 15 * M_BYTES / (16 * 50e9)


@pytest.mark.parametrize("mode", ["ring", "tree", "best", "measured"])
def test_tp16_across_servers_uses_measured_time(tmp_path, mode):
    """A TP16 group spans both 8-GPU servers: its AllReduce is the 16-rank table's 32.74 us
    whatever the allreduce mode, and each decode step pays 2L of them."""
    problem = load(_write_instance(tmp_path, log=shared(*LOG), degrees=[16], allreduce=mode))
    perf = PerfModel(problem)
    assert perf.spans_servers(16)
    assert perf.allreduce_s(16) == pytest.approx(MEASURED_16384_S, rel=1e-12)
    L = problem.model.layers
    assert L == 64
    for s in (0, 4096, CTX):
        expected = _max_local_compute_s(problem, 16, s) + 2 * L * MEASURED_16384_S
        assert perf.step_time_s(16, s) == pytest.approx(expected, rel=1e-12)


def test_tp16_without_log_uses_scale_out_ring(tmp_path):
    with_log = PerfModel(load(_write_instance(tmp_path, log=shared(*LOG), degrees=[16])))
    (tmp_path / "b").mkdir()
    no_log = PerfModel(load(_write_instance(tmp_path / "b", log=None, degrees=[16])))
    ring = _scale_out_ring16_s()
    assert ring == pytest.approx(113.184e-6, rel=1e-9)  # 112.8 us of latency + 0.384 us of bandwidth
    assert no_log.allreduce_s(16) == pytest.approx(ring, rel=1e-12)
    assert no_log.allreduce_s(16) == pytest.approx(ring_allreduce_s(16, M_BYTES, 3.76e-6, 50e9), rel=1e-12)
    L = 64
    for s in (0, CTX):
        diff = no_log.step_time_s(16, s) - with_log.step_time_s(16, s)
        assert diff == pytest.approx(2 * L * (ring - MEASURED_16384_S), rel=1e-9)


def test_tp16_plan_timeline_uses_measured_steps(tmp_path, cli):
    """Solver, evaluator and JSON output agree on the measured step: one TP16 instance runs the
    four sessions back to back, each 8 steps at positions CTX .. CTX+7."""
    path = _write_instance(tmp_path, log=shared(*LOG), degrees=[16], deadline_ms=None)
    problem = load(path)
    r = solve(problem, "makespan")
    ev = r.outcome.evaluation
    assert r.status.value == "optimal"
    assert ev.violations == []
    assert [(i.degree, i.servers) for i in ev.plan.instances] == [(16, (0, 1))]
    service = sum(_max_local_compute_s(problem, 16, s) + 2 * 64 * MEASURED_16384_S for s in range(CTX, CTX + 8))
    finishes = sorted(t.finish_s for t in ev.nominal.sessions)
    assert finishes == pytest.approx([service * k for k in (1, 2, 3, 4)], rel=1e-9)
    assert r.outcome.value == pytest.approx(4 * service * 1e3, rel=1e-6)  # makespan, ms (solver's ticks: 1 us)

    out = cli(path, "--objective", "makespan", "--format", "json")
    assert out.exit_code == 0, out.output
    d = json.loads(out.stdout)
    assert d["status"] == "optimal"
    assert d["plan"]["makespan_ms"] == pytest.approx(4 * service * 1e3, rel=1e-9)


def test_mixed_degrees_on_two_servers(tmp_path):
    """tensor_parallel [8, 16] with the log: TP8 stays on NVLink (alpha-beta ring with the
    scale-up figures, 11.55 us), TP16 crosses servers (measured 32.74 us)."""
    problem = load(_write_instance(tmp_path, log=shared(*LOG), degrees=[8, 16], fraction=0.75, deadline_ms=130))
    perf = PerfModel(problem)
    assert not perf.spans_servers(8)
    assert perf.allreduce_s(8) == pytest.approx(ring_allreduce_s(8, M_BYTES, 0.822e-6, 450e9), rel=1e-12)
    assert round(perf.allreduce_s(8) * 1e6, 2) == 11.55
    assert perf.allreduce_s(16) == pytest.approx(MEASURED_16384_S, rel=1e-12)
    r = solve(problem, "cost")
    assert r.outcome.evaluation.violations == []
    # one TP16 runs the four sessions back to back at ~53 ms each: 2 of 4 by 130 ms < 3 required;
    # two TP8 instances (one per server, 41.2 ms per session) finish all four by 82.4 ms
    assert sorted(i.degree for i in r.outcome.evaluation.plan.instances) == [8, 8]


def test_measured_on_intra_server_group_falls_back_to_scale_up_ring(tmp_path):
    """``allreduce: measured`` with a 16-rank table: a TP8 group has no table of its rank count
    (and does not use scale-out), so it uses the alpha-beta ring with NVLink figures."""
    problem = load(_write_instance(tmp_path, log=shared(*LOG), degrees=[8], allreduce="measured", servers=1,
                                   fraction=0.75, deadline_ms=130))
    perf = PerfModel(problem)
    assert problem.server.scale_out.table.ranks == 16
    assert perf.allreduce_s(8) == pytest.approx(ring_allreduce_s(8, M_BYTES, 0.822e-6, 450e9), rel=1e-12)
    assert perf.allreduce_s(8) != pytest.approx(MEASURED_16384_S)
    assert round(perf.step_time_s(8, CTX) * 1e3, 2) == 5.15  # the chapter's TP8 step


def test_table_rank_count_must_match_group(tmp_path):
    """TP32 on four servers with a 16-rank table: alpha-beta ring on scale-out, not the table."""
    problem = load(_write_instance(tmp_path, log=shared(*LOG), degrees=[32], servers=4))
    perf = PerfModel(problem)
    assert perf.allreduce_s(32) == pytest.approx(ring_allreduce_s(32, M_BYTES, 3.76e-6, 50e9), rel=1e-12)


# ----------------------------------------------------------------------------- synthetic logs

_HEADER = "#  Rank {r:2d} Group  0 Pid  {pid} on node-{n} device  {d} [0000:19:00] NVIDIA H100 80GB HBM3"
_ROW = "{size:>12} {count:>13}     float     sum      -1 {t:8.2f}    0.00    0.00      0 {t:8.2f}    0.00    0.00      0"


def _log_text(ranks: int, rows: list[tuple[int, float]], *, rank_lines: bool = True) -> str:
    lines = ["# nThread 1 nGpus 1 minBytes 8 maxBytes 65536 step: 2(factor) warmup iters: 5 iters: 20", "#",
             "# Using devices"]
    if rank_lines:
        lines += [_HEADER.format(r=r, pid=1000 + r, n=r // 8, d=r % 8) for r in range(ranks)]
    lines += ["#", "#       size         count      type   redop    root     time   algbw   busbw #wrong"]
    lines += [_ROW.format(size=s, count=max(1, s // 4), t=t) for s, t in rows]
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.00", "#"]
    return "\n".join(lines) + "\n"


GOOD_ROWS = [(8192, 20.0), (16384, 21.5), (32768, 23.0), (65536, 27.0)]


def test_synthetic_scale_up_table_used_only_when_measured(tmp_path):
    """An 8-rank table on the scale-up tier: used by TP8 with ``measured``, not with ``ring``."""
    log = tmp_path / "nvlink8.txt"
    log.write_text(_log_text(8, GOOD_ROWS))
    t = read_nccl_allreduce_log(log)
    assert t.ranks == 8 and list(t.size_bytes) == [8192, 16384, 32768, 65536]
    measured = PerfModel(load(_write_instance(tmp_path, log=None, scale_up_log=log, degrees=[8],
                                              allreduce="measured", servers=1)))
    assert measured.allreduce_s(8) == pytest.approx(21.5e-6, rel=1e-12)
    (tmp_path / "b").mkdir()
    ring = PerfModel(load(_write_instance(tmp_path / "b", log=None, scale_up_log=log, degrees=[8], servers=1)))
    assert ring.allreduce_s(8) == pytest.approx(ring_allreduce_s(8, M_BYTES, 0.822e-6, 450e9), rel=1e-12)


def _short_row(text: str) -> str:
    lines = text.splitlines()
    i = next(k for k, l in enumerate(lines) if l.strip().startswith("16384"))
    lines[i] = "       16384          4096     float     sum      -1    21.50"
    return "\n".join(lines) + "\n"


BAD_LOGS = {
    "too_few_columns": (_short_row(_log_text(16, GOOD_ROWS)), ["line ", "expected 13 columns", "got 6"]),
    "no_rank_lines": (_log_text(16, GOOD_ROWS, rank_lines=False), ["no '#  Rank N ...' lines"]),
    "sizes_not_increasing": (_log_text(16, [(8192, 20.0), (32768, 23.0), (16384, 21.5)]),
                             ["not strictly increasing"]),
    "repeated_size": (_log_text(16, [(8192, 20.0), (16384, 21.5), (16384, 21.6)]), ["not strictly increasing"]),
    "time_not_a_number": (_log_text(16, GOOD_ROWS).replace("   21.50", "     N/A", 1), ["not a number"]),
    "no_rows": (_log_text(16, []), ["no all_reduce_perf data rows"]),
    "too_small_for_message": (_log_text(16, [(8, 20.0), (4096, 20.5), (8192, 21.0)]),
                              ["hardware.server.scale_out.allreduce_log", "measures up to 8192 B",
                               "AllReduce message of 10240 B"]),
}


@pytest.mark.parametrize("case", sorted(BAD_LOGS))
def test_malformed_log_is_one_line_exit_2(tmp_path, cli, case):
    text, needles = BAD_LOGS[case]
    log = tmp_path / "bad_all_reduce_perf.txt"
    log.write_text(text)
    path = _write_instance(tmp_path, log=log, degrees=[8, 16])
    assert_one_line_error(cli(path), "bad_all_reduce_perf.txt" if case != "too_small_for_message" else "inst.yaml",
                    *needles)


@pytest.mark.parametrize("case", sorted(set(BAD_LOGS) - {"too_small_for_message"}))
def test_malformed_log_raises_input_error(tmp_path, case):
    log = tmp_path / "bad.txt"
    log.write_text(BAD_LOGS[case][0])
    with pytest.raises(InputError) as exc:
        read_nccl_allreduce_log(log)
    assert "bad.txt" in exc.value.line()


def test_missing_log_file(tmp_path, cli):
    path = _write_instance(tmp_path, log=tmp_path / "nothere.txt", degrees=[16])
    assert_one_line_error(cli(path), "inst.yaml", "hardware.server.scale_out.allreduce_log", "file not found")


def test_relative_log_path_is_relative_to_instance(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "ar.txt").write_text(_log_text(16, GOOD_ROWS))
    path = _write_instance(tmp_path, log=Path("logs/ar.txt"), degrees=[16])
    assert PerfModel(load(path)).allreduce_s(16) == pytest.approx(21.5e-6, rel=1e-12)
