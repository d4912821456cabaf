"""Instance schema of the expert-placement problem (the ``experts:`` section).

Example::

    name: deepseek-v3 style EP32 with 288 physical slots
    experts:
      trace: traces/example_load.json   # relative to the instance file
      format: auto                      # auto | matrix | vllm | sglang | topk
      num_gpus: 32
      num_nodes: 4
      num_groups: 8
      slots_per_gpu: 9                  # or a list with one entry per GPU
      fit_windows: all                  # all | last:N | first:N
      evaluate_windows: next            # next | rest | none
      work_units_per_layer: 0.5         # CP-SAT deterministic time per layer (default by layer size)
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from optimizer.errors import InputError
from optimizer.schema_base import StrictModel, validate

_WINDOWS = re.compile(r"^(all|last:[1-9]\d*|first:[1-9]\d*)$")


class ExpertsSection(StrictModel):
    """The ``experts:`` section.

    Attributes:
        trace: trace file (or folder for ``topk``), relative to the instance file.
        format: trace format, or ``auto`` to detect it.
        num_experts: logical experts per layer (required for ``topk``; checked otherwise).
        top_k: experts per token for ``topk`` traces (default: inferred from line lengths).
        window_tokens: ``topk`` windows of this many tokens (default: one per sequence).
        num_gpus, num_nodes: the expert-parallel group; GPUs split evenly over nodes.
        num_groups: expert groups for the hierarchical greedy baseline (1: global policy).
        slots_per_gpu: physical replicas per GPU (one number, or one per GPU).
        fit_windows: windows the plan is fitted on: ``all``, ``last:N`` or ``first:N``.
        evaluate_windows: ``next`` (the window after the fitted ones), ``rest`` (all later
            windows) or ``none``. With ``all``/``last:N`` and next/rest, the final window is
            held out for evaluation.
        previous_placement: a phy2log file (placement.json, SGLang
            ``physical_to_logical_map`` JSON, or a bare [layers, replicas] list).
        migration_weight: load units (tokens) charged per expert copy moved (max-load).
        split: ``even`` (EPLB's) or ``optimal`` (shares per replica are decisions).
        max_load_tolerance: inter-node / migration: allowed max-load increase over the
            phase-1 optimum, as a fraction (never above the greedy max load).
        workers: processes solving layers in parallel.
        work_units_per_layer: search effort per layer in CP-SAT deterministic time units
            (summed over the layer's solves); fixed work makes runs reproducible, unlike a
            wall-clock split. ``--time-limit`` stays a wall-clock guard on top. Default:
            :func:`optimizer.experts.solve.default_work` (1 unit for a small layer, a share of 3
            units over the layers, 0.02-1 each, for a large one).
    """

    trace: str
    format: Literal["auto", "matrix", "vllm", "sglang", "topk"] = "auto"
    num_experts: int | None = Field(default=None, ge=1, le=65536)
    top_k: int | None = Field(default=None, ge=1)
    window_tokens: int | None = Field(default=None, ge=1)
    num_gpus: int = Field(ge=1, le=4096)  # EP groups beyond this are far past any deployment
    num_nodes: int = Field(default=1, ge=1, le=4096)
    num_groups: int = Field(default=1, ge=1)
    slots_per_gpu: int | list[int]
    fit_windows: str = "all"
    evaluate_windows: Literal["next", "rest", "none"] = "next"
    previous_placement: str | None = None
    migration_weight: float = Field(default=0.0, ge=0)
    split: Literal["even", "optimal"] = "even"
    max_load_tolerance: float = Field(default=0.02, ge=0, le=1)
    workers: int = Field(default=2, ge=1, le=64)
    work_units_per_layer: float | None = Field(default=None, gt=0, le=10000)

    @field_validator("fit_windows")
    @classmethod
    def _fit(cls, v: str) -> str:
        if not _WINDOWS.match(v):
            raise ValueError("expected all, last:N or first:N")
        return v

    @field_validator("slots_per_gpu")
    @classmethod
    def _slots(cls, v):
        vals = [v] if isinstance(v, int) else v
        if not vals or any(isinstance(s, bool) or s < 1 for s in vals):
            raise ValueError("slots must be positive integers")
        return v


class ExpertsInstance(StrictModel):
    name: str = ""
    experts: ExpertsSection


def parse(raw: dict, path: Path) -> ExpertsInstance:
    """Validate the raw instance mapping.

    Raises:
        InputError: unknown keys, wrong types or values, GPUs that do not split over nodes,
            a per-GPU slot list of the wrong length.
    """
    inst = validate(ExpertsInstance, raw, path)
    ex = inst.experts
    if ex.num_gpus % ex.num_nodes:
        raise InputError(path, "experts.num_nodes", f"{ex.num_gpus} GPUs do not split evenly over {ex.num_nodes} nodes")
    if isinstance(ex.slots_per_gpu, list) and len(ex.slots_per_gpu) != ex.num_gpus:
        raise InputError(path, "experts.slots_per_gpu", f"{len(ex.slots_per_gpu)} entries, expected one per GPU ({ex.num_gpus})")
    return inst


def slots_list(ex: ExpertsSection) -> list[int]:
    return list(ex.slots_per_gpu) if isinstance(ex.slots_per_gpu, list) else [ex.slots_per_gpu] * ex.num_gpus
