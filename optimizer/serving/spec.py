"""Registry entry of the serving problem (see :mod:`optimizer.problems`)."""
from optimizer.problems import ProblemSpec

SPEC = ProblemSpec(
    section="serving",
    package="optimizer.serving",
    summary="request-rate serving: cheapest aggregated or disaggregated workers meeting TTFT/TPOT SLOs",
    objectives="objectives.serving",
    plots="optimizer.serving.plots",
)
