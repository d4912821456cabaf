"""Build-out objective ``tokens``: the most delivered tokens/s for the instance's workload
(maximise ``sum_t tokens_t n_t``).

``tokens_t`` is what one server of type ``t`` delivers, in whole tokens/s: its GPUs times the best
aggregated worker's tokens/s per GPU at the workload's SLO (``buildout.workload``; timed by the
serving model under the workload's step-time source, :func:`optimizer.buildout.workload.tokens_per_server`).
``gpus`` counts an H200 and a B200 alike; this objective weighs each by what it serves.
"""
from __future__ import annotations

from dataclasses import dataclass

from objectives.buildout import BuildoutObjective


@dataclass(frozen=True)
class MostTokens(BuildoutObjective):
    def expr(self, model):
        """Delivered tokens/s (model units are whole tokens/s)."""
        return sum(t.tokens_per_s_int * model.n[t.name] for t in model.problem.types)

    def better_than(self, model, value: float):
        return self.expr(model) >= int(value) + 1


OBJECTIVE = MostTokens(name="tokens", unit="tokens/s", sense="max",
                       definition="the most output tokens/s the servers deliver for buildout.workload at its SLO "
                                  "(each server type's GPUs times its best aggregated worker's tokens/s per GPU)",
                       needs_target=False, needs_cost=False, short_unit="tokens/s", next_unit_hint=False,
                       needs_workload=True)
