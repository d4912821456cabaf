"""Expert-load skew for the supernode's All-to-All (``supernode.expert_load``).

Without the section the dispatch and combine are timed as uniform (every card's experts take
``1/S`` of the routed tokens). With it, a routing trace in any format the expert-placement
problem reads (:mod:`optimizer.model.traces`: vLLM ``load_history``, SGLang ``logical_count``,
a matrix, DeepSeek ESFT ``expert_weights_<layer>.txt`` folders) gives each layer's expert load
fractions ``f_e`` (token counts summed over the trace's windows, divided by the layer's total).

Experts sit on the S cards of a domain in order, without rebalancing: on the unit interval
expert e holds ``[e/E, (e+1)/E)`` and card d ``[d/S, (d+1)/S)``, and card d takes the load of
the part of each expert it holds (an expert spread over several cards splits its tokens evenly):

    share_d = sum_e f_e x E x |[e/E, (e+1)/E) n [d/S, (d+1)/S)|

so with S dividing E a card takes its E/S experts' fractions, and a trace of E experts maps onto
any S (a trace of another model carries its skew shape over, not its expert identities; the
trace's expert count need not be the model's). Every card routes its tokens to card d in
proportion to share_d (:func:`optimizer.model.fabric.moe_traffic`); the All-to-All of a layer
takes its busiest directed link (:func:`optimizer.model.fabric.moe_link_loads`), and the model's
MoE layers each take the mean over the trace's layers (see :mod:`optimizer.supernode.fabric`).
Expert placement itself stays the expert-placement problem's decision (``experts:``); the
expert weights read per step still assume uniform routing (:mod:`optimizer.supernode.perf`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, Optional

import numpy as np
from pydantic import Field

from optimizer.errors import InputError
from optimizer.schema_base import StrictModel

PosInt = Annotated[int, Field(strict=True, ge=1)]


class ExpertLoadIn(StrictModel):
    """The ``supernode.expert_load`` section: a routing trace (fields as ``experts:``'s)."""

    trace: str
    format: Literal["auto", "matrix", "vllm", "sglang", "topk"] = "auto"
    num_experts: Optional[PosInt] = None
    top_k: Optional[PosInt] = None
    window_tokens: Optional[PosInt] = None


@dataclass(frozen=True)
class ExpertLoad:
    """Per-layer expert load fractions of a trace (``fractions[l][e]``, each row sums to 1)."""

    file: str
    format: str
    windows: int
    layer_names: tuple[str, ...]
    experts: int
    fractions: tuple[tuple[float, ...], ...]

    @property
    def layers(self) -> int:
        return len(self.fractions)

    def card_shares(self, cards: int) -> np.ndarray:
        """``[layers, cards]``: each card's share of the routed tokens (module docstring)."""
        return _card_shares(self, cards)

    def busiest_card_ratio(self, cards: int) -> float:
        """Mean over the layers of the busiest card's share x ``cards`` (1 for uniform load)."""
        return float(np.mean(self.card_shares(cards).max(axis=1)) * cards)


@lru_cache(maxsize=256)
def _card_shares(load: ExpertLoad, cards: int) -> np.ndarray:
    f = np.asarray(load.fractions, dtype=float)
    E, S = f.shape[1], cards
    # positions in units of 1 / (E S): expert e holds [e S, (e+1) S), card d [d E, (d+1) E)
    cum = np.concatenate([np.zeros((f.shape[0], 1)), np.cumsum(f, axis=1)], axis=1)  # load left of e S

    def loaded_left_of(u: np.ndarray) -> np.ndarray:
        e = np.minimum(u // S, E - 1)
        return cum[:, e] + f[:, e] * ((u - e * S) / S)

    edges = np.arange(S + 1) * E
    out = np.diff(loaded_left_of(edges), axis=1)
    out.setflags(write=False)
    return out


def resolve_expert_load(e: ExpertLoadIn, path: Path, routed_experts: int) -> ExpertLoad:
    """Read the trace (relative to the instance file) into per-layer load fractions.

    Raises:
        InputError: the model has no routed experts, the trace cannot be read (its reader's
            error, naming ``supernode.expert_load``), or a layer routes no token.
    """
    from optimizer.model.traces import read_trace

    where = "supernode.expert_load"
    if routed_experts == 0:
        raise InputError(path, where, "the model has no routed experts: there is no All-to-All to skew")
    trace_path = Path(path).parent / e.trace
    try:
        tr = read_trace(trace_path, e.format, e.num_experts, e.window_tokens, e.top_k)
    except InputError as exc:
        at = f"{exc.field}: " if exc.field else ""
        raise InputError(path, f"{where}.trace", f"{exc.file}: {at}{exc.problem}") from None
    counts = tr.loads.sum(axis=0).astype(float)  # [layers, experts], windows summed
    totals = counts.sum(axis=1)
    empty = np.flatnonzero(totals <= 0)
    if empty.size:
        raise InputError(path, f"{where}.trace", f"{trace_path}: layer {tr.layer_names[int(empty[0])]} routes no "
                                                  f"token in any window")
    frac = counts / totals[:, None]
    return ExpertLoad(str(trace_path), tr.format, tr.num_windows, tuple(tr.layer_names), tr.num_experts,
                      tuple(tuple(float(x) for x in row) for row in frac))
