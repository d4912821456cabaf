"""Serving objective ``gpus``: fewest GPUs, ``Σ_j g_j·n_j`` (g_j GPUs per worker of configuration j)."""
from objectives.serving import ServingObjective


def _expr(model):
    return model.gpus


OBJECTIVE = ServingObjective("gpus", "GPUs", "GPUs of all prefill, decode and aggregated workers of the plan, GPUs",
                             "min", True, _expr)
