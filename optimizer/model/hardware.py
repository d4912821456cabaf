"""Hardware seen by the performance model: one GPU type, one server type, two network tiers.

Figures come from ``instances/hardware/catalog.yaml`` (:func:`hardware_from_catalog`) or from a
problem's resolved hardware (any objects with the same attribute names). SI units throughout:
bytes, bytes/s, FLOP/s, seconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from optimizer.catalog import check_gpu_in_server, lookup
from optimizer.model.collectives import AllReduceSource, ring_allreduce_s, tree_allreduce_s

GB = 1e9


FP8_DTYPES = frozenset({"fp8"})
FP4_DTYPES = frozenset({"fp4", "nvfp4"})


def peak_flops_for(gpu: Any, dtype: Optional[str]) -> float:
    """Dense tensor-core peak (FLOP/s) of ``gpu`` for matrix products in ``dtype``.

    ``fp8`` -> ``gpu.fp8_flops``; ``fp4``/``nvfp4`` -> ``gpu.fp4_flops``; any other dtype
    (``bf16``, ``fp16``, weight-only ``int4``/``int8``, ``fp32``), ``None``, or a GPU without a
    figure for that dtype (no attribute, or ``None``: e.g. A100 has no FP8 tensor cores) ->
    ``gpu.peak_flops`` (dense BF16). Works on any object with ``peak_flops`` (the deployment
    problem's GPU, a test's stand-in).
    """
    name = dtype.lower() if isinstance(dtype, str) else None
    attr = "fp8_flops" if name in FP8_DTYPES else "fp4_flops" if name in FP4_DTYPES else None
    peak = getattr(gpu, attr, None) if attr else None
    return float(peak) if peak is not None else gpu.peak_flops


@dataclass(frozen=True)
class GpuSpec:
    """memory_bytes, hbm_bytes_per_s (HBM bandwidth), peak_flops (dense BF16 FLOP/s) and the
    optional dense FP8 / FP4 tensor-core peaks ``fp8_flops`` / ``fp4_flops`` (FLOP/s; ``None``:
    the GPU has none, its matrix products in that dtype run at the BF16 peak)."""

    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    peak_flops: float
    fp8_flops: Optional[float] = None
    fp4_flops: Optional[float] = None

    def peak_flops_for(self, dtype: Optional[str]) -> float:
        """Dense peak (FLOP/s) for matrix products in ``dtype`` (see :func:`peak_flops_for`)."""
        return peak_flops_for(self, dtype)


def gpu_spec_from_catalog(name: str, entry: dict) -> GpuSpec:
    """:class:`GpuSpec` of a catalog GPU entry (``instances/hardware/catalog.yaml`` fields:
    ``memory_gb``, ``memory_bandwidth_gb_s``, ``bf16_tflops`` and the optional ``fp8_tflops``,
    ``fp4_tflops``), in SI units."""
    def peak(key: str) -> Optional[float]:
        v = entry.get(key)
        return None if v is None else v * 1e12

    return GpuSpec(name, entry["memory_gb"] * GB, entry["memory_bandwidth_gb_s"] * GB, entry["bf16_tflops"] * 1e12,
                   peak("fp8_tflops"), peak("fp4_tflops"))


@dataclass(frozen=True)
class LinkSpec:
    """One network tier, per GPU per direction: bandwidth (bytes/s), alpha (s per round), and an
    optional nccl-tests AllReduce table (:class:`optimizer.model.collectives.AllReduceTable`)."""

    bandwidth_bytes_per_s: float
    alpha_s: float
    table: Any = None


@dataclass(frozen=True)
class ServerSpec:
    """gpus per server; scale_up (NVLink) and scale_out (NIC) tiers."""

    name: str
    gpus: int
    scale_up: LinkSpec
    scale_out: LinkSpec


@dataclass(frozen=True)
class Hardware:
    """The GPU and server of an instance, and how AllReduce is timed.

    Attributes:
        gpu: any object with ``memory_bytes``, ``hbm_bytes_per_s``, ``peak_flops`` (and optionally
            ``fp8_flops``, ``fp4_flops``; see :func:`peak_flops_for`).
        server: any object with ``gpus``, ``scale_up``, ``scale_out`` (links with
            ``bandwidth_bytes_per_s``, ``alpha_s``, ``table``).
        allreduce: "ring" (eq. 6-9), "tree" (eq. 6-10), "best" (the faster) or "measured" (the
            nccl-tests table of the group's tier).
    """

    gpu: Any
    server: Any
    allreduce: str = "ring"

    def spans_servers(self, gpus: int) -> bool:
        """True when a group of ``gpus`` GPUs does not fit in one server (uses scale-out)."""
        return gpus > self.server.gpus

    def link(self, gpus: int):
        """The tier a group of ``gpus`` GPUs communicates over."""
        return self.server.scale_out if self.spans_servers(gpus) else self.server.scale_up

    def allreduce_s(self, p: int, message_bytes: float) -> float:
        """Time of one AllReduce of ``message_bytes`` in a group of ``p`` GPUs (s); see
        :meth:`allreduce_source` for which table or formula gives it. Zero for p <= 1."""
        return self.allreduce_source(p, message_bytes).time_s

    def allreduce_source(self, p: int, message_bytes: float):
        """The AllReduce time of a ``p``-GPU group with its source and the reason for it
        (:class:`optimizer.model.collectives.AllReduceSource`).

        ring (eq. 6-9), tree (eq. 6-10), best = the faster; ``measured``, and any group that spans
        servers when the tier has an nccl-tests table, uses the out-of-place time of the smallest
        measured size >= the message, for tables with ``p`` ranks (alpha-beta otherwise, also when
        the message exceeds the table).
        """
        if p <= 1:
            return AllReduceSource(p, "none", "", "", 0.0, f"TP{p} has no AllReduce")
        spans = self.spans_servers(p)
        tier = "scale_out" if spans else "scale_up"
        link = self.link(p)
        mode = self.allreduce
        table = link.table
        log = str(table.path) if table is not None else None
        ranks = table.ranks if table is not None else None
        wants_log = mode == "measured" or spans
        fits = table is not None and message_bytes <= table.size_bytes[-1]
        if table is not None and wants_log and table.ranks == p and fits:
            why = ("allreduce: measured" if mode == "measured"
                   else f"TP{p} spans servers: the scale_out log is used in every mode")
            return AllReduceSource(p, "log", "measured", tier, table.time_for(message_bytes),
                                   f"{why}; log has {table.ranks} ranks", log, ranks)
        ring = ring_allreduce_s(p, message_bytes, link.alpha_s, link.bandwidth_bytes_per_s)
        tree = tree_allreduce_s(p, message_bytes, link.alpha_s, link.bandwidth_bytes_per_s)
        if table is not None and wants_log and table.ranks != p:
            why = f"log has {table.ranks} ranks, TP{p} needs {p}"
        elif table is not None and wants_log:
            why = f"message of {message_bytes:.0f} B exceeds the log's largest size {int(table.size_bytes[-1])} B"
        elif table is not None:
            why = f"allreduce: {mode}; the {tier} log is used only with allreduce: measured"
        elif mode == "measured":
            why = f"no allreduce_log on {tier}"
        else:
            why = f"allreduce: {mode}"
        if mode == "tree":
            return AllReduceSource(p, "model", "tree", tier, tree, why, log, ranks)
        if mode == "best":
            algo = "tree" if tree < ring else "ring"
            why += f" (tree {tree * 1e6:.2f} us, ring {ring * 1e6:.2f} us)"
            return AllReduceSource(p, "model", algo, tier, min(ring, tree), why, log, ranks)
        return AllReduceSource(p, "model", "ring", tier, ring, why, log, ranks)

    def alltoall_s(self, n: int, bytes_out_per_gpu: float) -> float:
        """All-to-All among ``n`` GPUs, each sending ``bytes_out_per_gpu`` spread evenly over the
        others (s). Alpha-beta, pairwise exchange: the share ``(g-1)/(n-1)`` of the bytes that stays
        in a server of ``g`` GPUs goes over scale-up in ``g-1`` rounds, the share that leaves it over
        the GPU's NIC (scale-out) in ``n-g`` rounds; the two tiers work concurrently (max).
        Zero for n <= 1."""
        if n <= 1:
            return 0.0
        g = min(n, self.server.gpus)
        up, out = self.server.scale_up, self.server.scale_out
        inside = bytes_out_per_gpu * (g - 1) / (n - 1)
        outside = bytes_out_per_gpu - inside
        t_up = (g - 1) * up.alpha_s + inside / up.bandwidth_bytes_per_s
        t_out = (n - g) * out.alpha_s + outside / out.bandwidth_bytes_per_s if n > g else 0.0
        return max(t_up, t_out)

    def p2p_s(self, message_bytes: float, crosses_servers: bool) -> float:
        """One point-to-point send (a pipeline hand-off): ``alpha + M/B`` on the tier used (s)."""
        link = self.server.scale_out if crosses_servers else self.server.scale_up
        return link.alpha_s + message_bytes / link.bandwidth_bytes_per_s


def hardware_from_catalog(gpu: str, server: str, allreduce: str = "ring", file: Optional[str] = None) -> Hardware:
    """:class:`Hardware` for catalog names (``instances/hardware/catalog.yaml``), in SI units.

    Raises:
        InputError: unknown name.
    """
    g = lookup("gpus", gpu, file or "catalog", "gpu")
    s = lookup("servers", server, file or "catalog", "server")
    check_gpu_in_server(gpu, server, file or "catalog", "server")

    def _link(d: dict) -> LinkSpec:
        return LinkSpec(d["bandwidth_gb_s"] * GB, d["latency_us"] * 1e-6)

    return Hardware(
        gpu_spec_from_catalog(gpu, g),
        ServerSpec(server, s["gpus"], _link(s["scale_up"]), _link(s["scale_out"])),
        allreduce,
    )
