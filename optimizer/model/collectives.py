"""AllReduce time: alpha-beta models (reference chapter eqs. 6-9, 6-10) and nccl-tests tables.

Units: seconds, bytes, bytes/s. ``alpha_s`` is the latency of one communication round;
``bandwidth`` is per GPU per direction.

nccl-tests logs (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``,
``alltoall_perf``, ...) all print one results table in the same layout, written by
``src/common.cu`` / ``src/util.cu`` of https://github.com/NVIDIA/nccl-tests:

* rank lines ``#  Rank  0 Group  0 Pid 1234 on host device  0 [...] NVIDIA H100 ...``;
* a group line (``out-of-place ... in-place``) and a column header, e.g.
  ``#  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong``.
  Versions differ: before the ``root`` column (2019) the header has 12 columns and the
  error column is called ``error``; all_gather/alltoall of that time had no ``redop``
  column; the 2016 tables call the columns ``bytes N type op ... res``; ``-C 1`` prints
  ``cputime``; ``-R`` (per-iteration) adds ``i_min i_max i_p99 i_cv%``; timestamps add a
  two-word ``timestamp`` column. The layout is therefore read from the header, never assumed.
* one data row per message size, times in microseconds, bandwidths in GB/s (1e9 B/s).

Launchers prefix every line: Open MPI ``--tag-output`` (``[1,0]<stdout>:``), Slurm
``srun --label`` (``0: ``), MPICH/Intel MPI ``-prepend-rank`` (``[0] ``). NCCL's own
``host:pid:tid [dev] NCCL INFO ...`` lines and anything else that is not a table row are
skipped.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

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
class NcclTestsTable:
    """The out-of-place results table of one nccl-tests run.

    Attributes:
        path: the log file.
        ranks: number of ranks the test ran on (distinct ``#  Rank N`` lines).
        size_bytes: message sizes, ascending, shape [n] (the ``size`` column).
        time_s: out-of-place time per size, seconds, shape [n].
        busbw_gb_s: out-of-place bus bandwidth per size, GB/s, shape [n].
        collective: the nccl-tests binary without ``_perf`` (``all_reduce``, ``all_gather``,
            ``reduce_scatter``, ``alltoall``, ...) when the log names it, else None.
        collective_source: where that name was read (``line 2``), or "" when not named.
        data_type: the ``type`` column (``float``, ``bfloat16``, ...), None if the header has none.
        redop: the ``redop`` column (``sum``, ... ; ``none`` for non-reducing collectives),
            None if the header has no reduction-op column.
    """

    path: Path
    ranks: int
    size_bytes: np.ndarray
    time_s: np.ndarray
    busbw_gb_s: np.ndarray
    collective: Optional[str] = None
    collective_source: str = ""
    data_type: Optional[str] = None
    redop: Optional[str] = None

    def time_for(self, message_bytes: float) -> float:
        """Out-of-place time of the smallest measured size >= ``message_bytes`` (seconds).

        Raises:
            ValueError: the message is larger than the largest measured size.
        """
        idx = int(np.searchsorted(self.size_bytes, message_bytes, side="left"))
        if idx >= len(self.size_bytes):
            raise ValueError(f"message of {message_bytes:.0f} B exceeds the largest size in {self.path}")
        return float(self.time_s[idx])


AllReduceTable = NcclTestsTable  # an NcclTestsTable whose rows are AllReduce rows

# Launcher prefixes, stripped once each from the start of a line.
_PREFIXES = (
    re.compile(r"^.*?\[\d+,\d+\]<std(?:out|err|diag)>:[ \t]?"),  # Open MPI --tag-output (after an optional timestamp)
    re.compile(r"^\[\d+\][ \t]"),  # MPICH / Intel MPI -prepend-rank
    re.compile(r"^[ \t]*\d+:[ \t]?"),  # Slurm srun --label
)
_RANK_RE = re.compile(r"^#\s*Rank\s+(\d+)\s")
_STARTING_RE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_BINARY_RE = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|alltoallv?|broadcast|reduce|gather|scatter|"
                        r"sendrecv|hypercube)_perf(?:_mpi)?\b")
_GROUP_RE = re.compile(r"out-of-place|in-place")
# header names across nccl-tests versions -> one name
_ALIASES = {"bytes": "size", "n": "count", "op": "redop", "res": "wrong", "error": "wrong", "#wrong": "wrong",
            "cputime": "time"}
# bytes per element of nccl-tests type names (src/common.cu test_typenames, old and new)
TYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "f8e4m3": 1, "f8e5m2": 1, "half": 2, "bfloat16": 2,
              "int32": 4, "uint32": 4, "int": 4, "float": 4, "int64": 8, "uint64": 8, "double": 8}


def strip_launcher_prefix(line: str) -> str:
    """``line`` without an Open MPI ``[j,r]<stdout>:``, MPICH ``[r] `` or Slurm ``N: `` prefix."""
    for rx in _PREFIXES:
        line = rx.sub("", line, count=1)
    return line


@dataclass
class _Layout:
    line: int
    names: list[str]  # normalised column names
    n_tokens: int  # tokens a data row has (a timestamp column is two words)
    time: int
    busbw: int
    count: Optional[int]
    type: Optional[int]
    redop: Optional[int]
    root: Optional[int]


def _number(token: str) -> Optional[float]:
    """``float(token)`` if it is a finite number (nccl-tests prints ``-nan``/``inf`` on failures)."""
    try:
        x = float(token)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _is_row(tokens: list[str]) -> bool:
    """A results row starts with two integers (size, count); a lone integer is a cut-off row."""
    return bool(tokens) and tokens[0].isdigit() and (len(tokens) == 1 or tokens[1].isdigit())


def _layout(path: Path, lineno: int, tokens: list[str], group_line: str) -> _Layout:
    names = [_ALIASES.get(t.lower(), t.lower().lstrip("#")) for t in tokens]
    times = [i for i, n in enumerate(names) if n == "time"]
    if not times:
        raise InputError(path, f"line {lineno}", "nccl-tests column header has no time column")
    labels = _GROUP_RE.findall(group_line) or ["out-of-place", "in-place"]
    groups = [labels[k] if k < len(labels) else f"group {k + 1}" for k in range(len(times))]
    if "out-of-place" not in groups:
        raise InputError(path, f"line {lineno}", "nccl-tests column header has no out-of-place time column")
    k = groups.index("out-of-place")
    t = times[k]
    end = times[k + 1] if k + 1 < len(times) else len(names)
    bus = [i for i in range(t, end) if names[i] == "busbw"]
    if not bus:
        raise InputError(path, f"line {lineno}", "nccl-tests column header has no out-of-place busbw column")

    def col(name: str) -> Optional[int]:
        return names.index(name) if name in names[:times[0]] else None

    n_tokens = len(names) + (1 if "timestamp" in names else 0)
    return _Layout(lineno, names, n_tokens, t, bus[0], col("count"), col("type"), col("redop"), col("root"))


@dataclass(frozen=True)
class _RowFacts:
    roots: dict[str, int]  # root column value -> first line
    counts: list[tuple[int, int, int]]  # (line, size, count) per row


def read_nccl_tests_log(path: Path) -> NcclTestsTable:
    """Parse the output of any nccl-tests ``*_perf`` binary (one run per file).

    The column layout comes from the ``#  size  count ...`` header line; the out-of-place
    ``time`` (us) and ``busbw`` (GB/s) of each row are kept. Launcher prefixes are stripped
    and lines that are not table rows (NCCL INFO/WARN, launcher chatter) are skipped. The
    collective is read from ``# Collective test starting: NAME`` or, failing that, from a
    ``*_perf`` binary named on another line (the command line).

    Raises:
        InputError: (file, line, problem) for a missing/unreadable file, a data row before
            any header, a header with no time column, a data row with the wrong number of
            columns or a non-numeric/non-positive size, time or busbw, two results tables,
            two different collectives named, no data rows, no rank lines, or sizes not
            strictly increasing.
    """
    return _parse(path)[0]


def _parse(path: Path) -> tuple[NcclTestsTable, _RowFacts]:
    if not path.exists():
        raise InputError(path, "", "nccl-tests log file not found")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, "", f"cannot read nccl-tests log: {exc}") from None
    ranks: set[int] = set()
    named: dict[str, int] = {}  # binary -> first line naming it (not on a "starting" line)
    started: dict[str, int] = {}  # binary -> first "# Collective test starting" line
    layout: Optional[_Layout] = None
    prev_comment = ""
    sizes: list[int] = []
    times: list[float] = []
    busbw: list[float] = []
    row_lines: list[int] = []
    kinds: dict[tuple[str, str], int] = {}  # (type, redop) -> first row line
    roots: dict[str, int] = {}
    counts: list[tuple[int, int, int]] = []  # (line, size, count)
    for lineno, raw in enumerate(lines, start=1):
        line = strip_launcher_prefix(raw)
        s = line.strip()
        if not s:
            continue
        tokens = s.split()
        if s.startswith("#"):
            m = _RANK_RE.match(s)
            if m:
                ranks.add(int(m.group(1)))
                continue
            m = _STARTING_RE.match(s)
            if m:
                b = _BINARY_RE.search(m.group(1))
                name = b.group(1) if b else Path(m.group(1)).name.removesuffix("_mpi").removesuffix("_perf")
                started.setdefault(name, lineno)
                continue
            head = s.lstrip("#").split()
            if head and head[0].lower() in ("size", "bytes"):
                if layout is not None:
                    raise InputError(path, f"line {lineno}", f"a second nccl-tests results table (the first header is "
                                     f"at line {layout.line}): give one run per file")
                layout = _layout(path, lineno, head, prev_comment)
                continue
            prev_comment = s
            for m in _BINARY_RE.finditer(s):
                named.setdefault(m.group(1), lineno)
            continue
        if not _is_row(tokens):
            for m in _BINARY_RE.finditer(s):
                named.setdefault(m.group(1), lineno)
            continue
        if layout is None:
            raise InputError(path, f"line {lineno}", "data row before any nccl-tests column header "
                             "('#  size  count  type ... time  algbw  busbw ...')")
        if len(tokens) != layout.n_tokens:
            raise InputError(path, f"line {lineno}", f"expected {layout.n_tokens} columns (header at line "
                             f"{layout.line}), got {len(tokens)}")
        t_us, bw = _number(tokens[layout.time]), _number(tokens[layout.busbw])
        if t_us is None:
            raise InputError(path, f"line {lineno}", f"out-of-place time '{tokens[layout.time]}' is not a number")
        if bw is None:
            raise InputError(path, f"line {lineno}", f"out-of-place busbw '{tokens[layout.busbw]}' is not a number")
        size = int(tokens[0])
        if size <= 0 or t_us <= 0:
            raise InputError(path, f"line {lineno}", "size and time must be positive")
        kind = (tokens[layout.type] if layout.type is not None else "",
                tokens[layout.redop] if layout.redop is not None else "")
        kinds.setdefault(kind, lineno)
        if layout.root is not None:
            roots.setdefault(tokens[layout.root], lineno)
        if layout.count is not None and tokens[layout.count].isdigit():
            counts.append((lineno, size, int(tokens[layout.count])))
        sizes.append(size)
        row_lines.append(lineno)
        times.append(t_us * 1e-6)
        busbw.append(bw)

    if not sizes:
        raise InputError(path, "", "no nccl-tests data rows found" + ("" if layout else " (and no column header)"))
    if not ranks:
        raise InputError(path, "", "no '#  Rank N ...' lines: cannot tell how many ranks were measured")
    if len(kinds) > 1:
        shown = ", ".join("/".join(x for x in k if x) for k in kinds)
        raise InputError(path, f"line {sorted(kinds.values())[1]}", f"rows of several data types or reduction ops "
                         f"({shown}): give a log of one -d TYPE -o OP run")
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        i = next(k for k, (a, b) in enumerate(zip(sizes, sizes[1:])) if b <= a)
        raise InputError(path, f"line {row_lines[i + 1]}", f"message sizes are not strictly increasing "
                         f"({sizes[i]} B then {sizes[i + 1]} B)")
    if len(started) > 1 or (not started and len(named) > 1):
        src = started or named
        raise InputError(path, "", "the log names several collectives ("
                         + ", ".join(f"{c}_perf at line {n}" for c, n in src.items()) + ")")
    src = started or named
    collective, where = next(iter(src.items()), (None, 0))
    dtype, redop = next(iter(kinds))
    table = NcclTestsTable(path, len(ranks), np.array(sizes, dtype=np.int64), np.array(times), np.array(busbw),
                           collective, f"line {where}" if collective else "", dtype or None,
                           redop if layout.redop is not None else None)
    return table, _RowFacts(roots, counts)


def read_nccl_allreduce_log(path: Path) -> NcclTestsTable:
    """Parse an nccl-tests ``all_reduce_perf`` log (see :func:`read_nccl_tests_log`) and check
    that it is an AllReduce table.

    A log that names another collective is refused; so is one whose rows cannot be AllReduce
    rows: no reduction op (``redop`` missing or ``none``), a root other than -1 (reduce,
    broadcast), or a size that is not ``count × bytes(type)`` (all_gather, reduce_scatter and
    alltoall print the per-rank count, so their size is ``ranks`` times larger).

    Raises:
        InputError: as :func:`read_nccl_tests_log`, or the log is not an AllReduce log.
    """
    t, facts = _parse(path)
    if t.collective is not None and t.collective != "all_reduce":
        raise InputError(path, t.collective_source, f"the log is from {t.collective}_perf, not all_reduce_perf: "
                         "allreduce_log needs an AllReduce table")
    what = f"{t.collective}_perf log" if t.collective else "log"
    if t.redop is None or t.redop == "none":
        raise InputError(path, "", f"rows carry no reduction op (redop {t.redop or 'column missing'}): "
                         "not an all_reduce_perf table")
    bad_root = next(((r, n) for r, n in facts.roots.items() if r != "-1"), None)
    if bad_root is not None:
        raise InputError(path, f"line {bad_root[1]}", f"root {bad_root[0]}: a rooted collective (reduce, broadcast), "
                         f"not AllReduce ({what})")
    b = TYPE_BYTES.get(t.data_type or "")
    if b is not None:
        for lineno, size, count in facts.counts:
            if size != count * b:
                raise InputError(path, f"line {lineno}", f"size {size} B is not count {count} x {b} B ({t.data_type}): "
                                 "not an AllReduce row (all_gather/reduce_scatter/alltoall print per-rank counts)")
    return t


@dataclass(frozen=True)
class AllReduceSource:
    """Where the AllReduce time of one TP degree comes from, and why.

    Attributes:
        degree: TP degree p.
        source: ``log`` (an nccl-tests table), ``model`` (alpha-beta, eq. 6-9 ring or 6-10
            tree) or ``none`` (TP1: no AllReduce).
        algorithm: ``measured``, ``ring`` or ``tree`` ("" for TP1).
        tier: ``scale_up`` or ``scale_out`` ("" for TP1).
        time_s: time of one AllReduce of the hidden vector, seconds.
        reason: why this source, e.g. ``log has 2 ranks, TP4 needs 4``.
        log: the nccl-tests log of the tier, if any (also when it was not used).
        log_ranks: rank count of that log.
    """

    degree: int
    source: str
    algorithm: str
    tier: str
    time_s: float
    reason: str
    log: Optional[str] = None
    log_ranks: Optional[int] = None

    def to_dict(self) -> dict:
        return {"source": self.source, "algorithm": self.algorithm, "tier": self.tier,
                "time_us": self.time_s * 1e6, "reason": self.reason, "log": self.log, "log_ranks": self.log_ranks}

    def summary(self) -> str:
        """Short text for a table cell: ``log, 16 ranks: 32.74 us``, ``ring model: 11.55 us``, or
        ``ring model: 4.97 us; log has 2 ranks, TP4 needs 4`` when a log exists but was not used
        (or ``measured`` found none). The log file itself is in :meth:`to_dict`."""
        if self.source == "none":
            return "-"
        t = f"{self.time_s * 1e6:.2f} us"
        if self.source == "log":
            return f"log, {self.log_ranks} ranks: {t}"
        if self.log is None and not self.reason.startswith("no allreduce_log"):
            return f"{self.algorithm} model: {t}"
        return f"{self.algorithm} model: {t}; {self.reason}"
