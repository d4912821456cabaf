"""Serving objective ``dollars``: lowest hourly price, ``Σ_j price_j·g_j·n_j`` (price per GPU-hour of the pool)."""
from objectives.serving import ServingObjective


def _expr(model):
    return model.dollars


OBJECTIVE = ServingObjective("dollars", "$/hour", "price of the plan's GPUs for one hour at each pool's "
                             "dollars_per_gpu_hour, $/hour", "min", False, _expr)
