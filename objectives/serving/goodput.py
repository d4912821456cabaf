"""Serving objective ``goodput``: highest request rate that meets the SLOs with the GPUs given
(a variable R with every role's capacity ``Σ_j r_j·n_j >= R``)."""
from objectives.serving import ServingObjective


def _expr(model):
    return model.rate


OBJECTIVE = ServingObjective("goodput", "requests/s", "highest request rate (requests/s) whose requests meet the "
                             "TTFT and TPOT targets at the attainment asked, with the pools' GPUs", "max", False, _expr)
