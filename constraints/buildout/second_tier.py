"""Build-out family ``second_tier``: switching power once the GPUs exceed one fabric tier.

With a fabric, a single tier of switch chips serves up to ``one_tier_max_gpus`` GPUs; more
GPUs need a second (spine) tier that draws ``second_tier_power_kw``. A Boolean ``z`` says
whether the second tier is built; it is exactly ``[gpus > one_tier_max_gpus]``:

    gpus <= T1 + M * z          (second_tier[activation], M = an upper bound on the GPUs)
    gpus >= (T1 + 1) * z        (second_tier[definition]: no spine without need)

and ``P_2 * z`` is part of the power in :mod:`constraints.buildout.power`.
Source: the reference chapter's worked example (10.2 kW reserved once the GPUs exceed 64).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "second_tier"
ACTIVATION = ConstraintKey(FAMILY, "activation")
DEFINITION = ConstraintKey(FAMILY, "definition")


def define(model, p) -> None:
    f = p.fabric
    if f is None:
        return
    t1 = f.one_tier_max_gpus
    big = max(model.gpus_ub - t1, 0)
    model.add(ACTIVATION, model.gpus <= t1 + big * model.z)
    model.add(DEFINITION, model.gpus >= (t1 + 1) * model.z)


def describe(key: ConstraintKey, p) -> str:
    f = p.fabric
    return (f"more than {f.one_tier_max_gpus} GPUs need a second switch tier drawing "
            f"{f.second_tier_power_kw:g} kW")
