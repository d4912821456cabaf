"""HiGHS (highspy) helpers shared by the formulations that use it."""
from __future__ import annotations

import os
import sys

import highspy

_BANNER_SHOWN = False


def new_highs() -> highspy.Highs:
    """A silent ``highspy.Highs`` instance.

    HiGHS prints a copyright banner on the C-level stdout when the first instance of a
    process is created, before any option can be set; that would corrupt ``--format json``
    output, so the first construction runs with file descriptor 1 pointed at /dev/null.
    """
    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        h = highspy.Highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(devnull)
            os.close(saved)
        _BANNER_SHOWN = True
    h.setOptionValue("output_flag", False)
    return h


def single_thread(h: highspy.Highs) -> None:
    """Run ``h`` on one thread. HiGHS keeps one thread scheduler per process, sized by the first
    solve (PuLP's HiGHS, for instance, starts it at the machine's core count); a later instance
    asking for another size fails with kError. The scheduler is reset first, so the option holds
    whatever ran before in this process."""
    highspy.Highs.resetGlobalScheduler(True)
    h.setOptionValue("threads", 1)
