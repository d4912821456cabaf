"""Registry entry of the supernode sizing problem (see :mod:`optimizer.problems`)."""
from optimizer.problems import ProblemSpec

SPEC = ProblemSpec(
    section="supernode",
    package="optimizer.supernode",
    summary="scale-up domain size per instance and the tier of each lookup table and of KV",
    objectives="objectives.supernode",
    plots="optimizer.supernode.plots",
)
