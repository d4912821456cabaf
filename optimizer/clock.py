"""When the command started (``time.perf_counter()``), set by the CLI so that a problem's
``--time-limit`` can count the reading and validation of the input too. A light module: the
CLI sets it before it knows (or imports) the problem."""
from __future__ import annotations

from typing import Optional

COMMAND_START: Optional[float] = None


def take() -> Optional[float]:
    """The command's start, once: the next caller (e.g. a second solve in the same process)
    starts afresh."""
    global COMMAND_START
    t, COMMAND_START = COMMAND_START, None
    return t
