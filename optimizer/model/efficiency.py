"""The analytic source's efficiency factors, fitted to aiconfigurator-core's measured kernel database.

The reference chapter times a step by the roofline at datasheet peaks (eq. 6-2), about twice too
fast against measured runs. ``performance.source: analytic`` runs the same roofline on the GPU's
*achieved* peaks: the HBM bandwidth times ``memory``, every tensor-core peak times ``compute`` and
every link's bandwidth times ``network`` (latencies and nccl-tests tables unchanged), with the
three factors fitted per (GPU, engine) to the measured source's step times
(:mod:`optimizer.model.measured`) by ``python -m benchmarks.fit_efficiency``, which writes
``instances/hardware/efficiency.yaml``. A GPU the database lacks takes its generation's factors
(the mean of the covered GPUs of that architecture, e.g. H800 and H20 from H100/H200): the factors
are dimensionless shares of peak, so the datasheet peaks carry the GPU's own ratios. The file states,
per GPU, the fit's median error and, per generation, the error of carrying the factors to a
covered GPU left out of the fit.

``source: chapter`` is the roofline at the peaks themselves, as the book uses it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import yaml

from optimizer.catalog import catalog_path, generation_of


@dataclass(frozen=True)
class FittedEfficiency:
    """Achieved shares of peak of one GPU (and engine): ``compute``, ``memory``, ``network``
    (each in (0, 1]); ``why``: where they come from (fit or carry-over) with its median error."""

    compute: float
    memory: float
    network: float
    why: str


def efficiency_path() -> Path:
    """``instances/hardware/efficiency.yaml`` (beside the catalog)."""
    return catalog_path().parent / "efficiency.yaml"


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    p = efficiency_path()
    if not p.exists():
        return {}
    return yaml.safe_load(p.read_text(encoding="utf-8")) or {}


def _mean(fits: list[dict]) -> tuple[float, float, float]:
    """The mean compute, memory and network shares of several fits."""
    return tuple(sum(f[k] for f in fits) / len(fits) for k in ("compute", "memory", "network"))


def fitted_efficiency(gpu: str, engine: str) -> Optional[FittedEfficiency]:
    """The fitted factors of catalog GPU ``gpu`` under ``engine``: the (GPU, engine) fit, else the
    GPU's mean over engines, else its generation's (``generations`` of the file; the generation from
    the file's ``generation_of`` or the catalog's ``generation``), else, for a generation with no GPU
    in the database (Ada: L20), the mean of the fitted generations, said so in the note; None when
    the file has none of these (the caller falls back to the peaks and says so)."""
    t = _table()
    fits = t.get("fits", {})
    db = t.get("database", "the measured kernel database")
    g = fits.get(gpu, {})
    if engine in g:
        e = g[engine]
        return FittedEfficiency(e["compute"], e["memory"], e["network"],
                                f"fitted to {db} ({gpu}, {engine} {e['version']}; median step error "
                                f"{e['median_error_pct']:g}% over {e['points']} steps)")
    if g:
        vals = list(g.values())
        return FittedEfficiency(*_mean(vals), f"fitted to {db} ({gpu}, mean of {', '.join(sorted(g))}; {engine} not in the fit)")
    gen = t.get("generation_of", {}).get(gpu)
    if gen is None:  # a GPU added to the catalog after the fit: its catalog generation
        gen = generation_of().get(gpu)
    gens = t.get("generations", {})
    e = gens.get(gen) if gen else None
    if e is None and gen and gens:
        # no GPU of this generation is in the database: the mean of the fitted generations, with the
        # worst carry-over error measured between GPUs of one generation as its stated error
        vals = list(gens.values())
        carry = max((v["carry_error_pct"] for v in vals if v.get("carry_error_pct") is not None), default=None)
        within = f"; within one generation {carry:g}% median step error" if carry is not None else ""
        return FittedEfficiency(*_mean(vals), f"no {gen} GPU in {db}: the mean of the {', '.join(sorted(gens))} "
                                              f"factors (a carry-over across generations, not measured{within})")
    if e is None:
        return None
    carried = (f"carrying them to a left-out {gen} GPU measured {e['carry_error_pct']:g}% median step error"
               if e.get("carry_error_pct") is not None else
               f"one {gen} GPU in the fit, so the carry-over error is not measured")
    return FittedEfficiency(e["compute"], e["memory"], e["network"],
                            f"carried from the {gen} GPUs fitted to {db} ({', '.join(e['from'])}); {carried}")


def derated(hw: Any, compute: float, memory: float, network: float) -> Any:
    """``hw`` (a :class:`optimizer.model.hardware.Hardware`) with achieved peaks: HBM bandwidth
    times ``memory``, the BF16/FP8/FP4 tensor-core peaks times ``compute``, both tiers' link
    bandwidth times ``network`` (per-round latency and any nccl-tests table unchanged)."""
    g = hw.gpu
    gpu = replace(g, hbm_bytes_per_s=g.hbm_bytes_per_s * memory, peak_flops=g.peak_flops * compute,
                  fp8_flops=None if g.fp8_flops is None else g.fp8_flops * compute,
                  fp4_flops=None if g.fp4_flops is None else g.fp4_flops * compute)
    s = hw.server
    server = replace(s, scale_up=replace(s.scale_up, bandwidth_bytes_per_s=s.scale_up.bandwidth_bytes_per_s * network),
                     scale_out=replace(s.scale_out,
                                       bandwidth_bytes_per_s=s.scale_out.bandwidth_bytes_per_s * network))
    return replace(hw, gpu=gpu, server=server)
