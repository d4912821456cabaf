"""AllReduce time: alpha-beta models (reference chapter eqs. 6-9, 6-10) and nccl-tests tables.

Units: seconds, bytes, bytes/s. ``alpha_s`` is the latency of one communication round;
``bandwidth`` is per GPU per direction.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optimizer.errors import InputError

ACTIVATION_BYTES = 2.0  # hidden vector exchanged by the TP AllReduce is bf16 (H·2 bytes)


def ring_allreduce_s(p: int, message_bytes: float, alpha_s: float, bandwidth: float) -> float:
    """Ring AllReduce (eq. 6-9): ``2(p-1)·α + 2(p-1)·M/(p·B)``. Zero for p = 1."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha_s + 2 * (p - 1) * message_bytes / (p * bandwidth)


def tree_allreduce_s(p: int, message_bytes: float, alpha_s: float, bandwidth: float) -> float:
    """Tree AllReduce (eq. 6-10): ``2·log2(p)·(α + M/B)``. Zero for p = 1."""
    if p <= 1:
        return 0.0
    return 2 * math.log2(p) * (alpha_s + message_bytes / bandwidth)


@dataclass(frozen=True)
class AllReduceTable:
    """An nccl-tests ``all_reduce_perf`` measurement.

    Attributes:
        path: the log file.
        ranks: number of ranks the test ran on (from the "#  Rank" lines).
        size_bytes: message sizes, ascending, shape [n].
        time_s: out-of-place time per size, seconds, shape [n].
        busbw_gb_s: out-of-place bus bandwidth per size, GB/s, shape [n].
    """

    path: Path
    ranks: int
    size_bytes: np.ndarray
    time_s: np.ndarray
    busbw_gb_s: np.ndarray

    def time_for(self, message_bytes: float) -> float:
        """Out-of-place time of the smallest measured size >= ``message_bytes`` (seconds).

        Raises:
            ValueError: the message is larger than the largest measured size.
        """
        idx = int(np.searchsorted(self.size_bytes, message_bytes, side="left"))
        if idx >= len(self.size_bytes):
            raise ValueError(f"message of {message_bytes:.0f} B exceeds the largest size in {self.path}")
        return float(self.time_s[idx])


_RANK_RE = re.compile(r"^#\s+Rank\s+(\d+)\s")


def read_nccl_allreduce_log(path: Path) -> AllReduceTable:
    """Parse an nccl-tests ``all_reduce_perf`` output file.

    Data rows have 13 columns: size, count, type, redop, root, then out-of-place time (us),
    algbw, busbw (GB/s), #wrong, then the same four for in-place.

    Raises:
        InputError: missing file, a malformed data row, no data rows, no rank lines,
            or sizes not strictly increasing.
    """
    if not path.exists():
        raise InputError(path, "", "allreduce_log file not found")
    ranks: set[int] = set()
    sizes: list[int] = []
    times: list[float] = []
    busbw: list[float] = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, "", f"cannot read nccl-tests log: {exc}") from None
    for lineno, line in enumerate(lines, start=1):
        m = _RANK_RE.match(line)
        if m:
            ranks.add(int(m.group(1)))
            continue
        s = line.strip()
        if not s or s.startswith("#") or not s[0].isdigit():
            continue
        parts = s.split()
        if len(parts) < 13:
            raise InputError(path, f"line {lineno}", f"expected 13 columns of an all_reduce_perf row, got {len(parts)}")
        try:
            size = int(parts[0])
            t_us = float(parts[5])
            bw = float(parts[7])
        except ValueError:
            raise InputError(path, f"line {lineno}", "size, time or busbw is not a number") from None
        if size <= 0 or t_us <= 0:
            raise InputError(path, f"line {lineno}", "size and time must be positive")
        sizes.append(size)
        times.append(t_us * 1e-6)
        busbw.append(bw)
    if not sizes:
        raise InputError(path, "", "no all_reduce_perf data rows found")
    if not ranks:
        raise InputError(path, "", "no '#  Rank N ...' lines: cannot tell how many ranks were measured")
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise InputError(path, "", "message sizes are not strictly increasing")
    return AllReduceTable(path, len(ranks), np.array(sizes, dtype=np.int64), np.array(times), np.array(busbw))
