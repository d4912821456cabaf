"""``--progress`` rows of one deployment solve: an object handed to the solve methods.

Each row is ``{"method", "elapsed_s", "value", "bound", "gap", "unit"}`` (value and bound in
the objective's unit; gap relative to the value). A solve without ``--progress`` gets
:meth:`Progress.off`, whose :meth:`~Progress.report` does nothing; the comparison rows get a
muted copy, so the table follows the main solve only.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional

from optimizer.budget import ProgressSink

# improvement rows of these methods come at most every THROTTLE_S seconds (a local search can
# improve thousands of times a second)
THROTTLED = ("local search", "LNS", "cp-sat")
THROTTLE_S = 0.5


@dataclass
class Progress:
    """Where one solve's progress rows go.

    Attributes:
        sink: receives each row (None: rows are dropped).
        unit: the objective's unit, copied into every row.
        start: ``time.perf_counter()`` that ``elapsed_s`` counts from (the command's start).
    """

    sink: Optional[ProgressSink] = None
    unit: str = ""
    start: float = field(default_factory=time.perf_counter)
    _last: float = 0.0
    _held: Optional[dict] = None

    @classmethod
    def off(cls) -> "Progress":
        return cls(None)

    @property
    def active(self) -> bool:
        return self.sink is not None

    def muted(self) -> "Progress":
        """A copy that drops its rows (the comparison rows' solves)."""
        return Progress(None, self.unit, self.start)

    def report(self, method: str, value: Optional[float], bound: Optional[float]) -> None:
        """Send the incumbent ``value``, the proven ``bound`` and their gap, naming ``method``."""
        if self.sink is None:
            return
        now = time.perf_counter()
        if value is not None and not math.isfinite(value):
            value = None  # no plan meets the on-time requirement yet
        gap = None
        if value is not None and bound is not None and value > 0:
            gap = max(0.0, (value - bound) / abs(value))
        row = {"method": method, "elapsed_s": now - self.start, "value": value, "bound": bound, "gap": gap,
               "unit": self.unit}
        if method in THROTTLED and now - self._last < THROTTLE_S:
            self._held = row  # shown before the next row, so the last improvement is never lost
            return
        if self._held is not None and self._held["method"] != method:
            self.sink(self._held)
        self._held = None
        self._last = now
        self.sink(row)
