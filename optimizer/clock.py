"""When the command started (``time.perf_counter()``), set by the CLI so that a problem's
``--time-limit`` can count the reading and validation of the input too. A light module: the
CLI sets it before it knows (or imports) the problem."""
from __future__ import annotations

from typing import Optional

COMMAND_START: Optional[float] = None


# A process older than this at the command's start was not just starting up: the PID's start
# is then not the command's (a shell that ran other commands and exec'd `optimize` last keeps
# its PID: the README's install-and-run line counted 37 s of pip install against the limit).
# The interpreter's start-up and imports take 1-3 s here.
MAX_STARTUP_S = 10.0


def process_age_s() -> float:
    """Seconds since this process started (Linux: ``/proc/self/stat`` field 22, the start time
    in clock ticks after boot, against ``/proc/uptime``), so that ``--time-limit`` also counts
    the interpreter's start-up and imports; 0 where that cannot be read, and when the process
    is :data:`MAX_STARTUP_S` or older (its PID began before this command did)."""
    import os

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


# --time-limit T: a command's work ends by 92 % of T less 0.4 s (output, start-up already
# counted), at least half of T, so that the command ends within T + 10 %
HARD_SHARE, HARD_MARGIN_S = 0.92, 0.4


# seconds the CLI keeps out of every command's work for what follows it (``--plot``'s figures)
AFTER_S = 0.0


def budget_s(time_limit_s: float, extra_s: float = 0.0) -> float:
    """Seconds of work a command gets from its start under ``--time-limit`` (s):
    ``max(T/2, 0.92·T − 0.4 − extra_s − AFTER_S)`` (``extra_s``: e.g. writing a large plan;
    :data:`AFTER_S`: e.g. drawing the figures)."""
    return max(0.5 * time_limit_s, HARD_SHARE * time_limit_s - HARD_MARGIN_S - extra_s - AFTER_S)


def command_deadline(time_limit_s: Optional[float], extra_s: float = 0.0) -> Optional[float]:
    """When a command under ``--time-limit`` must end its work (a ``time.perf_counter()``
    value): the command's start (:func:`take`, else now) plus :func:`budget_s`; None without a
    limit (the start is taken either way, so a later solve in the process starts afresh)."""
    import time

    now = time.perf_counter()
    start = take()
    t0 = now if start is None else min(now, start)
    return None if time_limit_s is None else t0 + budget_s(time_limit_s, extra_s)


_FIRST = [True]


def startup_s() -> float:
    """:func:`process_age_s` for the process's first command, 0 for any later one (a test
    runner or a notebook invoking the CLI again in a long-lived process: its age is not that
    command's start-up)."""
    first, _FIRST[0] = _FIRST[0], False
    return process_age_s() if first else 0.0


def take() -> Optional[float]:
    """The command's start, once: the next caller (e.g. a second solve in the same process)
    starts afresh."""
    global COMMAND_START
    t, COMMAND_START = COMMAND_START, None
    return t
