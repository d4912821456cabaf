"""The routing-trace readers of the expert-placement problem: :mod:`optimizer.model.traces`
(shared with the supernode problem, which reads the same traces for its All-to-All skew)."""
from optimizer.model.traces import (FORMATS, Trace, detect_format, lognormal_loads,  # noqa: F401
                                    read_trace)

__all__ = ["FORMATS", "Trace", "detect_format", "lognormal_loads", "read_trace"]
