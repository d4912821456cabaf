"""Registry entry of the expert-placement problem (see :mod:`optimizer.problems`)."""
from optimizer.problems import ProblemSpec

SPEC = ProblemSpec(
    section="experts",
    package="optimizer.experts",
    summary="hot-expert placement from routing traces (EPLB done optimally)",
    objectives="objectives.experts",
    plots="optimizer.experts.plots",
)
