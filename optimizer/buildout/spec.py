"""Registry entry of the rack build-out problem (see :mod:`optimizer.problems`)."""
from optimizer.problems import ProblemSpec

SPEC = ProblemSpec(
    section="buildout",
    package="optimizer.buildout",
    summary="racks, servers and switches under a kW budget",
    objectives="objectives.buildout",
    plots="optimizer.buildout.plots",
)
