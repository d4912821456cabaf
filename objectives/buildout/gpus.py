"""Build-out objective ``gpus``: the most GPUs the budget and limits allow (maximise sum_t g_t n_t)."""
from __future__ import annotations

from dataclasses import dataclass

from objectives.buildout import BuildoutObjective


@dataclass(frozen=True)
class MostGpus(BuildoutObjective):
    def expr(self, model):
        """GPUs (model units are GPUs)."""
        return model.gpus

    def better_than(self, model, value: float):
        return model.gpus >= int(value) + 1

    def min_gpus_better_than(self, value: float) -> int:
        return int(value) + 1


OBJECTIVE = MostGpus(name="gpus", unit="GPUs", sense="max", default=True,
                     definition="the most GPUs the power budget, racks, fabric and install units allow, GPUs",
                     needs_target=False, needs_cost=False, short_unit="GPUs", next_unit_hint=True)
