"""The wall-clock budget of a command, passed explicitly from the CLI down to every solve phase.

A :class:`Budget` is created once, at CLI entry (:meth:`Budget.for_command`), from
``--time-limit T``. Its clock starts when the process started (the interpreter's start-up and
imports count against ``T``), and its work must end by ``max(T/2, 0.92·T − 0.4 s − reserve)``
so that the command, printing included, ends within ``T + 10 %`` (the promise in
``docs/cli.md``). A phase takes its share with :meth:`Budget.split`; phases that stopped early
record it with :meth:`Budget.note_cut`, and every budget split off one command shares that list.

Nothing here is module-level mutable state: a budget is a value handed to the code that uses it.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

# --time-limit T: work ends by HARD_SHARE·T − HARD_MARGIN_S (start-up already counted), and at
# least half of T, so that output and interpreter exit fit in the remaining 10 %.
HARD_SHARE, HARD_MARGIN_S = 0.92, 0.4
# A process older than this at the command's start was not just starting up (a shell that ran
# other commands and exec'd `optimize` keeps its PID): its age is then not the command's start-up.
MAX_STARTUP_S = 10.0


def process_age_s() -> float:
    """Seconds since this process started (Linux ``/proc/self/stat`` field 22, in clock ticks
    after boot, against ``/proc/uptime``), so that ``--time-limit`` also counts the interpreter's
    start-up; 0 where it cannot be read and when the process is :data:`MAX_STARTUP_S` or older."""
    try:
        with open("/proc/self/stat") as fh:
            stat = fh.read()
        start_ticks = float(stat.rsplit(")", 1)[1].split()[19])  # field 22 (1-based)
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0
    return age if 0.0 <= age < MAX_STARTUP_S else 0.0


def work_seconds(time_limit_s: float, reserve_s: float = 0.0) -> float:
    """Seconds of work under ``--time-limit`` T (s): ``max(T/2, 0.92·T − 0.4 − reserve_s)``."""
    return max(0.5 * time_limit_s, HARD_SHARE * time_limit_s - HARD_MARGIN_S - reserve_s)


@dataclass
class Budget:
    """A deadline on ``time.perf_counter()`` (None: no limit) and the record of what was cut short.

    Attributes:
        start: when the command started (perf_counter seconds).
        limit_s: the user's ``--time-limit`` (s), None without one; messages quote it.
        deadline: when this budget's work must end (perf_counter seconds), None without a limit.
        cut: names of the phases stopped early, shared by every budget split off this one.
    """

    start: float
    limit_s: Optional[float] = None
    deadline: Optional[float] = None
    cut: list = field(default_factory=list)

    @classmethod
    def for_command(cls, time_limit_s: Optional[float], started: Optional[float] = None,
                    reserve_s: float = 0.0) -> "Budget":
        """The budget of one command: counted from ``started`` (default: now less the process's
        age, see :func:`process_age_s`); ``reserve_s`` is kept out of the work for what follows it
        (writing figures)."""
        start = time.perf_counter() - process_age_s() if started is None else started
        if time_limit_s is None:
            return cls(start)
        return cls(start, time_limit_s, start + work_seconds(time_limit_s, reserve_s))

    @classmethod
    def unlimited(cls) -> "Budget":
        """A budget without deadline, starting now (library calls, tests)."""
        return cls(time.perf_counter())

    @classmethod
    def seconds(cls, s: Optional[float]) -> "Budget":
        """A budget of ``s`` seconds from now (None: unlimited); ``limit_s`` is ``s``."""
        now = time.perf_counter()
        return cls(now) if s is None else cls(now, s, now + s)

    @property
    def limited(self) -> bool:
        return self.deadline is not None

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    def remaining_s(self) -> float:
        """Seconds left (``inf`` without a limit, never negative)."""
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - time.perf_counter())

    def expired(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def split(self, share: float, at_least_s: float = 0.0) -> "Budget":
        """A child budget ending after ``share`` of the time left (at least ``at_least_s``, never
        past this budget's deadline unless ``at_least_s`` asks for it); without a limit the child
        is unlimited too. The child records cuts in this budget's list."""
        if self.deadline is None:
            return Budget(self.start, None, None, self.cut)
        now = time.perf_counter()
        left = max(0.0, self.deadline - now)
        return Budget(self.start, self.limit_s, now + max(at_least_s, share * left), self.cut)

    def within(self, seconds: Optional[float]) -> "Budget":
        """A child budget of at most ``seconds`` from now (None: this budget's own deadline)."""
        now = time.perf_counter()
        ends = [d for d in (self.deadline, None if seconds is None else now + seconds) if d is not None]
        return Budget(self.start, self.limit_s, min(ends) if ends else None, self.cut)

    def reserve(self, seconds: float) -> "Budget":
        """A child budget ending ``seconds`` before this one (for work that must follow it)."""
        if self.deadline is None:
            return Budget(self.start, None, None, self.cut)
        return Budget(self.start, self.limit_s, max(time.perf_counter(), self.deadline - seconds), self.cut)

    def note_cut(self, what: str) -> None:
        """Record that ``what`` stopped before it finished (listed under ``cut_short``)."""
        if what not in self.cut:
            self.cut.append(what)


# A progress sink: receives one row per improvement ({elapsed_s, method, value, bound, gap}).
ProgressSink = Callable[[dict], None]


def no_progress(_row: dict) -> None:
    """The progress sink of a run without ``--progress``."""
