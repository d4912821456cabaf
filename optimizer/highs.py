"""HiGHS (highspy) helpers shared by the formulations that use it: the one route to HiGHS.

HiGHS keeps one thread scheduler per process, sized by the first solve; a later instance asking
for another number of threads fails with kError. Every HiGHS instance of this project is made by
:func:`new_highs`, on one thread, so every solve of a process (serving, deployment, experts) asks
for the same scheduler and none has to reset it.
"""
from __future__ import annotations

import os
import sys
from functools import cache

import highspy

THREADS = 1  # the scheduler size every instance asks for (the MILPs and LPs here are small)


@cache
def _banner_taken() -> None:
    """Create the process's first ``highspy.Highs`` with file descriptor 1 pointed at /dev/null:
    HiGHS prints its copyright banner on the C-level stdout then, before any option can be set,
    which would corrupt ``--format json`` output. Runs once per process (HiGHS prints it once)."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(devnull)
        os.close(saved)


def new_highs() -> highspy.Highs:
    """A silent ``highspy.Highs`` instance on :data:`THREADS` thread(s)."""
    _banner_taken()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", THREADS)
    return h


def single_thread(h: highspy.Highs) -> None:
    """Run ``h`` on one thread (what :func:`new_highs` already sets; the deployment solver states it
    where it builds its models)."""
    h.setOptionValue("threads", THREADS)
