"""What one server of each build-out type delivers for a named model and workload (issue #38 point 6).

``buildout.workload`` names a model (its config.json), request lengths, TTFT/TPOT targets and a
step-time source (``performance:``, default ``auto``). For a server type that is a catalog server
(``instances/hardware/catalog.yaml``, which names its GPUs) the serving model
(:class:`optimizer.serving.perf.ServingModel`) sizes every aggregated worker that fits one server
at the SLO; the server delivers ``GPUs x max over workers (rate x OSL / worker GPUs)`` output
tokens/s, timed by the source it names, with that source's measured error band. Units: tokens/s.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from optimizer.errors import InputError


@dataclass(frozen=True)
class Delivered:
    """One server type's delivered output tokens/s (``per_server``, ``per_gpu``), the worker that
    gives it (``worker``: layout label), what timed it (``why``) and its measured TPOT band."""

    per_server: float
    per_gpu: float
    worker: str
    why: str
    tpot_band: Optional[float]


def tokens_per_server(workload: Any, server: str, gpu: str, gpus: int, path: Path, where: str) -> Delivered:
    """The delivered tokens/s of one ``server`` (catalog name) of ``gpus`` ``gpu`` for ``workload``
    (a :class:`optimizer.buildout.schema.WorkloadIn`).

    Raises:
        InputError: the workload's model or source cannot be read, or no worker meets the SLO
            on one server (named by ``where``).
    """
    from optimizer.serving import load_problem
    from optimizer.serving.perf import ServingModel

    cfg = Path(workload.model.config)
    raw = {"name": f"{server} for the build-out workload",
           "model": {k: v for k, v in {"config": str(cfg if cfg.is_absolute() else (path.parent / cfg).resolve()),
                                       "hf_id": workload.model.hf_id, "weight_dtype": workload.model.weight_dtype,
                                       "kv_dtype": workload.model.kv_dtype}.items() if v is not None},
           "hardware": {"gpu": gpu, "server": server, "servers": 1},
           "serving": {"traffic": {"rate_rps": 1.0, "isl": workload.traffic.isl, "osl": workload.traffic.osl},
                       "slo": {"ttft_ms": workload.slo.ttft_ms, "tpot_ms": workload.slo.tpot_ms},
                       "mode": "aggregated", "simulation": {"enabled": False}},
           "performance": workload.performance.model_dump(exclude_none=True)}
    try:
        p = load_problem(raw, path)
    except InputError as exc:  # a field of this instance: name it as the build-out's
        if exc.file != str(path):
            raise
        field = exc.field.removeprefix("serving.").removeprefix("hardware.")
        raise InputError(path, f"buildout.workload.{field}" if field else "buildout.workload", exc.problem) from None
    best = None
    for w in ServingModel(p).workers(("aggregated",)):
        if w.rate > 0:
            tok = w.rate * workload.traffic.osl / w.gpus
            if best is None or tok > best[0]:
                best = (tok, w.layout.label())
    if best is None:
        raise InputError(path, where, f"no aggregated worker on one {server} meets TTFT {workload.slo.ttft_ms:g} ms "
                                      f"and TPOT {workload.slo.tpot_ms:g} ms for the workload: it delivers nothing")
    t = next(iter(p.timing.values()))
    band = t["error_band"]["tpot_median_abs_error"] if t.get("error_band") else None
    return Delivered(best[0] * gpus, best[0], best[1], t["why"], band)
