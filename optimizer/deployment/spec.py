"""Registry entry of the deployment problem (see :mod:`optimizer.problems`)."""
from optimizer.problems import ProblemSpec

SPEC = ProblemSpec(
    section="deployment",
    package="optimizer.deployment",
    summary="split GPUs into instances, assign and order sessions with deadlines (model/hardware/workload)",
    objectives="objectives.deployment",
    plots="optimizer.deployment.plots",
    also_selected_by=frozenset({"model", "hardware", "workload"}),
)
