"""nccl-tests ``all_reduce_perf`` tables: parsing the real 2x8 H100 log, the measured AllReduce
time of a TP group that spans two servers (and its effect on the decode step), the alpha-beta
fallbacks, and malformed logs (exit 2, one line)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from optimizer.deployment import load, solve
from optimizer.model.collectives import (read_nccl_allreduce_log, read_nccl_tests_log, ring_allreduce_s,
                                              tree_allreduce_s)
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
        "performance": {"source": "chapter"},
        "workload": {"sessions": [session], "min_on_time_fraction": fraction},
        "deployment": {"reserve_gib_per_gpu": 2, "tensor_parallel": list(degrees), "allreduce": allreduce, "max_batch": 1},
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

_GROUPS = "#                                                              out-of-place                       in-place"
_COLUMNS = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw "
            "#wrong")
_UNITS = ("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
          "(GB/s)")
_HEADER = "#  Rank {r:2d} Group  0 Pid  {pid} on node-{n} device  {d} [0000:19:00] NVIDIA H100 80GB HBM3"
_ROW = "{size:>12} {count:>13}     float     sum      -1 {t:8.2f}    0.00    0.00      0 {t:8.2f}    0.00    0.00      0"


def _log_text(ranks: int, rows: list[tuple[int, float]], *, rank_lines: bool = True) -> str:
    lines = ["# nThread 1 nGpus 1 minBytes 8 maxBytes 65536 step: 2(factor) warmup iters: 5 iters: 20", "#",
             "# Using devices"]
    if rank_lines:
        lines += [_HEADER.format(r=r, pid=1000 + r, n=r // 8, d=r % 8) for r in range(ranks)]
    lines += ["#", _GROUPS, _COLUMNS, _UNITS]
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
    "no_rows": (_log_text(16, []), ["no nccl-tests data rows"]),
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


# ----------------------------------------------------------------------------- layouts real clusters produce
# Each fixture below is authored here in the layout one nccl-tests version prints (src/common.cu,
# src/util.cu); every one holds the same measurement, 4 ranks, out-of-place time and busbw:
LAYOUT_SIZES = [8192, 16384, 32768, 65536]
LAYOUT_TIMES_US = [20.00, 21.50, 23.00, 27.00]  # out-of-place; in-place columns hold other numbers
LAYOUT_BUSBW = [0.61, 1.14, 2.14, 3.64]

# 2019 nccl-tests: no root column (12 columns), "error" instead of "#wrong", old rank lines
LOG_12_COLUMNS = """\
# nThread 1 nGpus 1 minBytes 8192 maxBytes 65536 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  41001 on     gpu-a1 device  0 [0x18] Tesla V100-SXM2-32GB
#   Rank  1 Pid  41002 on     gpu-a1 device  1 [0x3b] Tesla V100-SXM2-32GB
#   Rank  2 Pid  52001 on     gpu-a2 device  0 [0x18] Tesla V100-SXM2-32GB
#   Rank  3 Pid  52002 on     gpu-a2 device  1 [0x3b] Tesla V100-SXM2-32GB
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        8192          2048   float     sum    20.00    0.41    0.61  0e+00    19.00    0.43    0.65  0e+00
       16384          4096   float     sum    21.50    0.76    1.14  0e+00    20.50    0.80    1.20  0e+00
       32768          8192   float     sum    23.00    1.42    2.14  0e+00    22.00    1.49    2.23  0e+00
       65536         16384   float     sum    27.00    2.43    3.64  0e+00    26.00    2.52    3.78  0e+00
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 1.8825
#
"""

# 2016 nccl-tests: "bytes N type op ... res" headers, no group line, no units line
LOG_2016 = """\
# Using devices
#   Rank  0 uses device  0 [0x04] Tesla P100-SXM2-16GB
#   Rank  1 uses device  1 [0x05] Tesla P100-SXM2-16GB
#   Rank  2 uses device  2 [0x06] Tesla P100-SXM2-16GB
#   Rank  3 uses device  3 [0x07] Tesla P100-SXM2-16GB
#      bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw      res
        8192          2048   float     sum    20.00   0.41   0.61    0e+00    19.00   0.43   0.65    0e+00
       16384          4096   float     sum    21.50   0.76   1.14    0e+00    20.50   0.80   1.20    0e+00
       32768          8192   float     sum    23.00   1.42   2.14    0e+00    22.00   1.49   2.23    0e+00
       65536         16384   float     sum    27.00   2.43   3.64    0e+00    26.00   2.52   3.78    0e+00
"""

_RANKS_4 = "\n".join(f"#  Rank {r:2d} Group  0 Pid {3100 + r:6d} on   gpu-b{r // 2} device {r % 2:2d} [0000:{r:02x}:00] "
                     "NVIDIA H100 80GB HBM3" for r in range(4))

# current nccl-tests, with "# Collective test starting" and -c 0 (no check: #wrong is N/A)
LOG_CURRENT = f"""\
# nccl-tests version 2.13.11 nccl-headers=22602 nccl-library=22602
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 8192 maxBytes 65536 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 0 graph: 0
#
# Using devices
{_RANKS_4}
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        8192          2048     float     sum      -1    20.00    0.41    0.61    N/A    19.00    0.43    0.65    N/A
       16384          4096     float     sum      -1    21.50    0.76    1.14    N/A    20.50    0.80    1.20    N/A
       32768          8192     float     sum      -1    23.00    1.42    2.14    N/A    22.00    1.49    2.23    N/A
       65536         16384     float     sum      -1    27.00    2.43    3.64    N/A    26.00    2.52    3.78    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 1.8825
#
# Collective test concluded: all_reduce_perf
"""

# -R 1 (per-iteration columns) and timestamps (a two-word column), cputime (-C 1)
LOG_PER_ITERATION = f"""\
# Collective test starting: all_reduce_perf
# Using devices
{_RANKS_4}
#
#                                                  out-of-place (+ per-iteration)                                in-place (+ per-iteration)
#       size         count      type   redop    root  cputime   algbw   busbw #wrong    i_min    i_max    i_p99    i_cv%  cputime   algbw   busbw #wrong    i_min    i_max    i_p99    i_cv%           timestamp
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%)     (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%)   %Y-%m-%d %H:%M:%S
        8192          4096  bfloat16     sum      -1    20.00    0.41    0.61      0    19.10    24.00    23.90     3.10    19.00    0.43    0.65      0    18.10    23.00    22.90     3.00 2026-11-02 10:00:01
       16384          8192  bfloat16     sum      -1    21.50    0.76    1.14      0    20.60    25.50    25.40     3.20    20.50    0.80    1.20      0    19.60    24.50    24.40     3.10 2026-11-02 10:00:01
       32768         16384  bfloat16     sum      -1    23.00    1.42    2.14      0    22.10    27.00    26.90     3.30    22.00    1.49    2.23      0    21.10    26.00    25.90     3.20 2026-11-02 10:00:02
       65536         32768  bfloat16     sum      -1    27.00    2.43    3.64      0    26.10    31.00    30.90     3.40    26.00    2.52    3.78      0    25.10    30.00    29.90     3.30 2026-11-02 10:00:02
"""


def _tag_output(text: str) -> str:
    """As ``mpirun --tag-output`` prints it: ``[1,r]<stdout>:`` before every line, and NCCL INFO
    lines (NCCL_DEBUG=INFO) from other ranks, on hosts whose names start with a digit."""
    out = []
    for i, line in enumerate(text.splitlines()):
        out.append(f"[1,0]<stdout>:{line}")
        if i == 3:
            out += ["[1,2]<stdout>:10-0-0-2:52001:52001 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>",
                    "[1,0]<stderr>:10-0-0-1:41001:41077 [0] NCCL INFO Channel 00/02 :    0   1   2   3",
                    "[1,3]<stdout>:10-0-0-2:52002:52002 [1] NCCL INFO NCCL version 2.26.2+cuda12.8"]
    return "\n".join(out) + "\n"


def _srun_label(text: str, width: int = 1) -> str:
    """As ``srun --label`` prints it: ``N: `` (task number right-aligned to ``width``)."""
    out = []
    for i, line in enumerate(text.splitlines()):
        out.append(f"{0:>{width}}: {line}")
        if i == 2:
            out.append(f"{3:>{width}}: 10-0-0-2:52002:52002 [1] NCCL INFO cudaDriverVersion 12080")
    return "\n".join(out) + "\n"


def _nccl_info_between(text: str) -> str:
    """NCCL INFO lines (no launcher prefix) from hosts named like ``10-0-0-1`` between the rows."""
    out = []
    for line in text.splitlines():
        out.append(line)
        if line.strip()[:1].isdigit():
            out.append("10-0-0-1:100:100 [0] NCCL INFO comm 0x55d0 rank 0 nranks 4 cudaDev 0 busId 19000 - Init COMPLETE")
    return "\n".join(out) + "\n"


LAYOUTS = {
    "12_columns_no_root": (LOG_12_COLUMNS, None),
    "2016_bytes_N_op_res": (LOG_2016, None),
    "current_wrong_na": (LOG_CURRENT, "all_reduce"),
    "per_iteration_cputime_timestamp": (LOG_PER_ITERATION, "all_reduce"),
    "mpirun_tag_output": (_tag_output(LOG_CURRENT), "all_reduce"),
    "mpirun_tag_output_12_columns": (_tag_output(LOG_12_COLUMNS), None),
    "srun_label": (_srun_label(LOG_CURRENT), "all_reduce"),
    "srun_label_padded": (_srun_label(LOG_12_COLUMNS, width=2), None),
    "nccl_info_digit_host": (_nccl_info_between(LOG_CURRENT), "all_reduce"),
}


@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_log_layouts_parse_to_the_same_table(tmp_path, case):
    text, collective = LAYOUTS[case]
    log = tmp_path / "ar.txt"
    log.write_text(text)
    t = read_nccl_allreduce_log(log)
    assert t.ranks == 4
    assert list(t.size_bytes) == LAYOUT_SIZES
    assert t.time_s == pytest.approx([x * 1e-6 for x in LAYOUT_TIMES_US], rel=1e-12)
    assert t.busbw_gb_s == pytest.approx(LAYOUT_BUSBW, rel=1e-12)
    assert t.collective == collective
    assert t.redop == "sum"


def test_12_column_log_drives_the_step_time(tmp_path):
    """The 2019 layout on the scale-up tier with ``measured``: TP4 pays 2L x 21.50 us (the
    16384 B row, the first >= the 10240 B message)."""
    log = tmp_path / "v100.txt"
    log.write_text(LOG_12_COLUMNS)
    problem = load(_write_instance(tmp_path, log=None, scale_up_log=log, degrees=[4], allreduce="measured", servers=1))
    perf = PerfModel(problem)
    assert perf.allreduce_s(4) == pytest.approx(21.50e-6, rel=1e-12)
    assert perf.step_time_s(4, CTX) == pytest.approx(_max_local_compute_s(problem, 4, CTX) + 2 * 64 * 21.50e-6,
                                                     rel=1e-12)


@pytest.mark.parametrize("wrap", ["tag_output", "srun_label", "srun_label_padded", "nccl_info"])
def test_real_log_wrapped_by_launchers_parses_to_the_same_values(tmp_path, wrap):
    real = shared(*LOG)
    plain = read_nccl_allreduce_log(real)
    text = real.read_text()
    text = {"tag_output": _tag_output, "srun_label": _srun_label, "srun_label_padded": lambda s: _srun_label(s, 3),
            "nccl_info": _nccl_info_between}[wrap](text)
    log = tmp_path / "wrapped.txt"
    log.write_text(text)
    t = read_nccl_allreduce_log(log)
    assert t.ranks == plain.ranks == 16
    assert np.array_equal(t.size_bytes, plain.size_bytes)
    assert np.array_equal(t.time_s, plain.time_s)
    assert np.array_equal(t.busbw_gb_s, plain.busbw_gb_s)


def test_real_log_collective_fields():
    t = read_nccl_allreduce_log(shared(*LOG))
    assert (t.collective, t.data_type, t.redop) == (None, "float", "sum")  # the log does not name its binary


# ----------------------------------------------------------------------------- other collectives

def _coll_log(*, name_line: str | None, redop: str, root: int, per_rank_count: bool, prefix: str = "") -> str:
    """A 4-rank current-layout log of any collective: ``per_rank_count`` prints count = size/4/ranks
    (all_gather, reduce_scatter, alltoall), else size/4 (all_reduce, reduce, broadcast)."""
    lines = [name_line] if name_line else []
    lines += ["# nThread 1 nGpus 1 minBytes 8192 maxBytes 65536 step: 2(factor) warmup iters: 5 iters: 20", "#",
              "# Using devices", *_RANKS_4.splitlines(), "#", _GROUPS, _COLUMNS, _UNITS]
    for size, t, bw in zip(LAYOUT_SIZES, LAYOUT_TIMES_US, LAYOUT_BUSBW):
        count = size // 4 // (4 if per_rank_count else 1)
        lines.append(f"{size:>12}  {count:>12}     float  {redop:>6}  {root:>6}  {t:7.2f}  {bw:6.2f}  {bw:6.2f}  "
                     f"     0  {t - 1:7.2f}  {bw:6.2f}  {bw:6.2f}       0")
    return "\n".join(prefix + l for l in lines) + "\n"


OTHER_COLLECTIVES = {
    "all_gather": _coll_log(name_line="# Collective test starting: all_gather_perf", redop="none", root=-1,
                            per_rank_count=True),
    "reduce_scatter": _coll_log(name_line="mpirun -np 4 -npernode 2 --bind-to numa /opt/nccl-tests/build/"
                                "reduce_scatter_perf -b 8K -e 64K -f 2 -g 1", redop="sum", root=-1, per_rank_count=True),
    "alltoall": _coll_log(name_line="srun --mpi=pmix -N 2 --ntasks-per-node=2 alltoall_perf_mpi -b 8K -e 64K",
                          redop="none", root=-1, per_rank_count=True, prefix="0: "),
}


@pytest.mark.parametrize("coll", sorted(OTHER_COLLECTIVES))
def test_other_collectives_parse_and_record_their_name(tmp_path, coll):
    log = tmp_path / f"{coll}.txt"
    log.write_text(OTHER_COLLECTIVES[coll])
    t = read_nccl_tests_log(log)
    assert t.collective == coll
    assert t.collective_source == "line 1"
    assert t.ranks == 4
    assert list(t.size_bytes) == LAYOUT_SIZES
    assert t.time_s == pytest.approx([x * 1e-6 for x in LAYOUT_TIMES_US], rel=1e-12)
    with pytest.raises(InputError) as exc:
        read_nccl_allreduce_log(log)
    assert f"the log is from {coll}_perf, not all_reduce_perf" in exc.value.line()


@pytest.mark.parametrize("line, name", [
    ("# Collective test starting: /opt/nccl-tests/build/all_gather_perf_mpi", "all_gather"),
    ("# Collective test starting: all_reduce_group_perf", "all_reduce_group"),
])
def test_starting_line_with_a_path_or_another_binary(tmp_path, line, name):
    log = tmp_path / "x.txt"
    log.write_text(_coll_log(name_line=line, redop="none", root=-1, per_rank_count=True))
    assert read_nccl_tests_log(log).collective == name
    with pytest.raises(InputError) as exc:
        read_nccl_allreduce_log(log)
    assert f"the log is from {name}_perf, not all_reduce_perf" in exc.value.line()


def test_all_gather_log_as_allreduce_log_is_one_line_exit_2(tmp_path, cli):
    log = tmp_path / "ag.txt"
    log.write_text(OTHER_COLLECTIVES["all_gather"])
    path = _write_instance(tmp_path, log=log, degrees=[8, 16])
    assert_one_line_error(cli(path), "ag.txt", "line 1", "the log is from all_gather_perf, not all_reduce_perf")


UNNAMED_NOT_ALLREDUCE = {
    # no binary named anywhere: the rows themselves show it is not AllReduce
    "all_gather": (dict(redop="none", root=-1, per_rank_count=True), "no reduction op (redop none)"),
    "reduce_scatter": (dict(redop="sum", root=-1, per_rank_count=True), "size 8192 B is not count 512 x 4 B"),
    "reduce": (dict(redop="sum", root=0, per_rank_count=False), "root 0: a rooted collective"),
}


@pytest.mark.parametrize("coll", sorted(UNNAMED_NOT_ALLREDUCE))
def test_unnamed_log_of_another_collective_is_refused(tmp_path, cli, coll):
    kw, needle = UNNAMED_NOT_ALLREDUCE[coll]
    log = tmp_path / "unnamed.txt"
    log.write_text(_coll_log(name_line=None, **kw))
    path = _write_instance(tmp_path, log=log, degrees=[8, 16])
    assert_one_line_error(cli(path), "unnamed.txt", needle)


def test_old_all_gather_without_redop_column_is_refused(tmp_path):
    text = LOG_12_COLUMNS.replace("   redop", "").replace("     sum", "")
    log = tmp_path / "ag2019.txt"
    log.write_text(text)
    with pytest.raises(InputError) as exc:
        read_nccl_allreduce_log(log)
    assert "redop column missing" in exc.value.line()


# ----------------------------------------------------------------------------- real damage, one line

def _lines_replaced(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


def _two_tables(text: str) -> str:
    lines = text.splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith("#       size"))
    return text + "\n".join(lines[i - 1:]) + "\n"


DAMAGED = {
    "header_without_time": (LOG_CURRENT.replace("    root     time", "    root  elapsed").replace(
        "#wrong     time", "#wrong  elapsed"), ["line 12", "no time column"]),
    "row_before_header": ("\n".join(l for l in LOG_12_COLUMNS.splitlines() if "size" not in l) + "\n",
                          ["line 11", "data row before any nccl-tests column header"]),
    "extra_column": (_lines_replaced(LOG_CURRENT, "27.00    2.43", "27.00  9  2.43"), ["line 17", "expected 13 columns",
                                                                                       "got 14"]),
    "short_row_12_columns": (_lines_replaced(LOG_12_COLUMNS, "    23.00    1.42    2.14  0e+00    22.00    1.49    "
                             "2.23  0e+00", "    23.00"), ["line 14", "expected 12 columns", "got 5"]),
    "busbw_not_a_number": (_lines_replaced(LOG_CURRENT, "21.50    0.76    1.14", "21.50    0.76    -nan"),
                           ["line 15", "busbw '-nan' is not a number"]),
    "time_not_a_number_12_columns": (_lines_replaced(LOG_12_COLUMNS, "21.50", "  N/A"),
                                     ["line 13", "time 'N/A' is not a number"]),
    "two_tables": (_two_tables(LOG_CURRENT), ["line 23", "second nccl-tests results table", "line 12"]),
    "several_types": (LOG_CURRENT.replace("       32768          8192     float", "        8192          4096      half")
                      .replace("       65536         16384     float", "       16384          8192      half"),
                      ["line 16", "several data types", "float/sum, half/sum"]),
    "two_collectives_named": ("mpirun -np 4 all_reduce_perf -b 8K\nmpirun -np 4 all_gather_perf -b 8K\n"
                              + LOG_12_COLUMNS, ["all_reduce_perf at line 1, all_gather_perf at line 2"]),
    "no_header_no_rows": ("[1,0]<stdout>:# nThread 1 nGpus 1\n[1,0]<stdout>:#  Rank  0 Group  0 Pid 1 on h device 0\n",
                          ["no nccl-tests data rows found (and no column header)"]),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_damaged_log_is_one_line_exit_2(tmp_path, cli, case):
    text, needles = DAMAGED[case]
    log = tmp_path / "damaged.txt"
    log.write_text(text)
    with pytest.raises(InputError):
        read_nccl_allreduce_log(log)
    path = _write_instance(tmp_path, log=log, degrees=[8, 16])
    assert_one_line_error(cli(path), "damaged.txt", *needles)


def test_non_row_lines_after_the_header_are_skipped(tmp_path):
    """Launcher chatter that starts with a number but is not a (size, count, ...) row."""
    lines = LOG_CURRENT.splitlines()
    i = next(k for k, l in enumerate(lines) if l.strip().startswith("16384"))
    lines[i:i] = ["1 warning generated.", "2026-11-02 10:00:01 node 10-0-0-1 heartbeat",
                  "12:34:56 srun: Job step 77.0 running"]
    log = tmp_path / "chatty.txt"
    log.write_text("\n".join(lines) + "\n")
    t = read_nccl_allreduce_log(log)
    assert list(t.size_bytes) == LAYOUT_SIZES


# ----------------------------------------------------------------------------- which AllReduce each degree used

TWO_RANK_ROWS = [(8192, 39.0), (16384, 40.0), (32768, 41.0)]  # a slow 2-GPU measurement: 40 us at 16384 B


def _two_rank_problem(tmp_path, allreduce="measured", degrees=(2, 4)):
    log = tmp_path / "pair-all_reduce_perf.txt"
    log.write_text(_log_text(2, TWO_RANK_ROWS))
    path = _write_instance(tmp_path, log=None, scale_up_log=log, degrees=list(degrees), allreduce=allreduce,
                           servers=1, deadline_ms=None)
    return log, path


def test_allreduce_source_with_a_2_rank_log(tmp_path):
    """``measured`` with a 2-rank table: TP2 uses the log (40 us), TP4 has no 4-rank table and
    falls back to the alpha-beta ring on NVLink, and says so."""
    log, path = _two_rank_problem(tmp_path)
    perf = PerfModel(load(path))
    tp1, tp2, tp4 = perf.allreduce_source(1), perf.allreduce_source(2), perf.allreduce_source(4)
    assert (tp1.source, tp1.time_s) == ("none", 0.0)
    assert (tp2.source, tp2.algorithm, tp2.tier, tp2.log, tp2.log_ranks) == ("log", "measured", "scale_up", str(log), 2)
    assert tp2.time_s == pytest.approx(40.0e-6, rel=1e-12) == perf.allreduce_s(2)
    ring4 = ring_allreduce_s(4, M_BYTES, 0.822e-6, 450e9)
    assert (tp4.source, tp4.algorithm, tp4.tier, tp4.log, tp4.log_ranks) == ("model", "ring", "scale_up", str(log), 2)
    assert tp4.reason == "log has 2 ranks, TP4 needs 4"
    assert tp4.time_s == pytest.approx(ring4, rel=1e-12) == perf.allreduce_s(4)
    assert round(tp4.time_s * 1e6, 2) == 4.97  # 6 x 0.822 us + 6 x 10240 B / (4 x 450 GB/s)
    assert tp4.summary() == "ring model: 4.97 us; log has 2 ranks, TP4 needs 4"
    assert tp2.summary() == "log, 2 ranks: 40.00 us"


def test_comparison_rows_say_where_each_allreduce_came_from(tmp_path, cli):
    """JSON: each comparison row and each plan instance carries its AllReduce source; TP4 (ring
    model) beats TP2 (measured 40 us), and the TP4 row says the log had only 2 ranks."""
    log, path = _two_rank_problem(tmp_path)
    out = cli(path, "--objective", "makespan", "--format", "json")
    assert out.exit_code == 0, out.output
    d = json.loads(out.stdout)
    rows = {r["option"]: r for r in d["alternatives"]}
    assert rows["tp2"]["allreduce"] == {"source": "log", "algorithm": "measured", "tier": "scale_up",
                                        "time_us": pytest.approx(40.0, rel=1e-12),
                                        "reason": "allreduce: measured; log has 2 ranks", "log": str(log),
                                        "log_ranks": 2}
    ring4_us = ring_allreduce_s(4, M_BYTES, 0.822e-6, 450e9) * 1e6
    assert rows["tp4"]["allreduce"] == {"source": "model", "algorithm": "ring", "tier": "scale_up",
                                        "time_us": pytest.approx(ring4_us, rel=1e-12),
                                        "reason": "log has 2 ranks, TP4 needs 4", "log": str(log), "log_ranks": 2}
    assert rows["tp4"]["value"] < rows["tp2"]["value"]  # the unmeasured degree wins: now visibly so
    for inst in d["plan"]["instances"]:
        assert inst["allreduce"] == rows[f"tp{inst['tp']}"]["allreduce"]


def test_comparison_table_has_an_allreduce_column(tmp_path):
    import io

    from rich.console import Console

    from optimizer.deployment import solve as solve_report

    log, path = _two_rank_problem(tmp_path)
    buf = io.StringIO()
    solve_report(load(path), "makespan").render(Console(file=buf, width=400))
    text = buf.getvalue()
    row = {l.split("│")[1].strip(): l for l in text.splitlines() if l.startswith("│ tp")}
    assert "log, 2 ranks: 40.00 us" in row["tp2"]
    assert "ring model: 4.97 us; log has 2 ranks, TP4 needs 4" in row["tp4"]
    assert f"AllReduce logs: scale_up {log} (2 ranks)" in text


@pytest.mark.parametrize("mode, degree, source, reason", [
    # a scale-up log is ignored unless allreduce: measured
    ("ring", 2, "model", "allreduce: ring; the scale_up log is used only with allreduce: measured"),
    ("tree", 4, "model", "allreduce: tree; the scale_up log is used only with allreduce: measured"),
])
def test_scale_up_log_unused_outside_measured(tmp_path, mode, degree, source, reason):
    """TP2 has a 2-rank table, yet ring/tree modes use the model, and say why."""
    log, path = _two_rank_problem(tmp_path, allreduce=mode)
    src = PerfModel(load(path)).allreduce_source(degree)
    expected = {"ring": ring_allreduce_s, "tree": tree_allreduce_s}[mode]
    assert (src.source, src.algorithm, src.reason) == (source, mode, reason)
    assert src.time_s == pytest.approx(expected(degree, M_BYTES, 0.822e-6, 450e9), rel=1e-12)


def test_allreduce_source_across_servers(tmp_path):
    """TP16 with the 16-rank scale-out log: the log in every mode; TP32 on four servers: the
    ring model, because the log has 16 ranks; TP8 under ``measured`` with no scale-up log."""
    real = shared(*LOG)
    src16 = PerfModel(load(_write_instance(tmp_path, log=real, degrees=[16]))).allreduce_source(16)
    assert (src16.source, src16.tier, src16.log_ranks, src16.log) == ("log", "scale_out", 16, str(real))
    assert src16.reason == "TP16 spans servers: the scale_out log is used in every mode; log has 16 ranks"
    assert src16.time_s == pytest.approx(MEASURED_16384_S, rel=1e-12)
    (tmp_path / "b").mkdir()
    src32 = PerfModel(load(_write_instance(tmp_path / "b", log=real, degrees=[32], servers=4))).allreduce_source(32)
    assert (src32.source, src32.algorithm, src32.reason) == ("model", "ring", "log has 16 ranks, TP32 needs 32")
    assert src32.time_s == pytest.approx(ring_allreduce_s(32, M_BYTES, 3.76e-6, 50e9), rel=1e-12)
    (tmp_path / "c").mkdir()
    src8 = PerfModel(load(_write_instance(tmp_path / "c", log=real, degrees=[8], servers=1, allreduce="measured",
                                          fraction=0.75, deadline_ms=130))).allreduce_source(8)
    assert (src8.source, src8.tier, src8.log, src8.reason) == ("model", "scale_up", None, "no allreduce_log on scale_up")
    assert src8.summary().endswith("; no allreduce_log on scale_up")


def test_allreduce_source_best_picks_the_faster_model(tmp_path):
    path = _write_instance(tmp_path, log=None, degrees=[8], allreduce="best", servers=1, fraction=0.75, deadline_ms=130)
    src = PerfModel(load(path)).allreduce_source(8)
    ring = ring_allreduce_s(8, M_BYTES, 0.822e-6, 450e9)
    tree = tree_allreduce_s(8, M_BYTES, 0.822e-6, 450e9)
    assert src.source == "model"
    assert src.algorithm == ("tree" if tree < ring else "ring")
    assert src.time_s == pytest.approx(min(ring, tree), rel=1e-12)
    assert src.reason == f"allreduce: best (tree {tree * 1e6:.2f} us, ring {ring * 1e6:.2f} us)"
