"""The ``serving:`` instance: strict input schema, traffic (fixed, classes, trace) and the resolved problem.

Input units are in the field names (``rate_rps``, ``ttft_ms``, ``bandwidth_gb_s``, ``latency_us``,
``reserve_gib_per_gpu``); :func:`load` converts them once to SI units (seconds, bytes, bytes/s)
held by :class:`Problem`. GB is 1e9 bytes, GiB 2^30 bytes.

Traces: a CSV with a header; either ``arrival_s, input_tokens, output_tokens`` (arrival in
seconds) or the public Azure LLM inference trace columns ``TIMESTAMP, ContextTokens,
GeneratedTokens`` (TIMESTAMP a date-time; arrivals are taken relative to the first row).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import numpy as np
from pydantic import ConfigDict, Field, field_validator

from optimizer.catalog import check_gpu_in_server, lookup
from optimizer.errors import InputError
from optimizer.model.config import ModelSpec, read_hf_config
from optimizer.model.checkpoint import Dtypes, resolve as resolve_dtypes
from optimizer.model.decode import DTYPE_BYTES
from optimizer.model.hardware import Hardware, LinkSpec, ServerSpec, gpu_spec_from_catalog
from optimizer.model.perf import PerfModel
from optimizer.model.prefill import Efficiency
from optimizer.model.prefix import PrefixReuse
from optimizer.model.steptimes import ANALYTIC, Performance, performance_from_input, roofline_only
from optimizer.model.steptimes import resolve as resolve_steps
from optimizer.schema_base import MAX_SERVERS, PerformanceIn, RopeScalingIn, StrictModel, existing_file, validate

GB = 1e9
GIB = 2 ** 30
MAX_TOKENS = 10_000_000
DEFAULT_KV_LINK_GB_S = 50.0  # one 400 Gbit/s NIC per GPU
HF_ID_PLACEHOLDER = "MODEL"  # launch commands without model.hf_id

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PosInt = Annotated[int, Field(strict=True, ge=1)]
Tokens = Annotated[int, Field(strict=True, ge=1, le=MAX_TOKENS)]
Share = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


class _In(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class ModelIn(_In):
    config: str = Field(min_length=1)
    hf_id: Optional[str] = Field(default=None, min_length=1, description="model name in launch commands")
    weight_dtype: Optional[str] = Field(default=None, description=(
        "null: the checkpoint's (its quantization_config; bf16 without one), optimizer/model/checkpoint.py"))
    kv_dtype: Optional[str] = Field(default=None, description=(
        "null: what the engine stores for this checkpoint (instances/engines/kv_defaults.yaml)"))
    rope_scaling: Optional[RopeScalingIn] = Field(default=None, description=(
        "RoPE scaling enabled at serving time (null: the config's own), as in deployment"))


class LinkIn(_In):
    bandwidth_gb_s: PosFloat
    latency_us: NonNegFloat


class PoolIn(_In):
    gpu: str = Field(min_length=1)
    server: str = Field(min_length=1)
    count: PosInt
    dollars_per_gpu_hour: Optional[PosFloat] = None


class HardwareIn(_In):
    gpu: Optional[str] = None

    @field_validator("gpu", mode="before")
    @classmethod
    def _catalog_gpu(cls, v):
        if isinstance(v, dict):  # deployment takes inline GPUs; serving times catalog GPUs only
            raise ValueError("a GPU name of instances/hardware/catalog.yaml (serving reads peaks, memory and "
                             "measured timings by name; an inline GPU mapping is for deployment instances)")
        return v

    server: Optional[str] = None
    servers: Optional[PosInt] = None
    dollars_per_gpu_hour: Optional[PosFloat] = None
    pools: Optional[list[PoolIn]] = Field(default=None, min_length=1)
    kv_link: Optional[LinkIn] = None
    allreduce: Literal["ring", "tree", "best"] = "ring"


class ClassIn(_In):
    isl: Tokens
    osl: Annotated[int, Field(strict=True, ge=2, le=MAX_TOKENS)]
    share: Share


class WindowIn(_In):
    """One window of a day plan (``serving.traffic.windows[i]``): its length, rate and lengths mix
    (:mod:`optimizer.serving.windows`)."""

    length_min: PosFloat
    rate_rps: NonNegFloat
    isl: Optional[Tokens] = None
    osl: Optional[Annotated[int, Field(strict=True, ge=2, le=MAX_TOKENS)]] = None
    classes: Optional[list[ClassIn]] = Field(default=None, min_length=1)


class StartupIn(_In):
    """``serving.startup``: what starting a worker costs in a day plan (:mod:`optimizer.serving.windows`)."""

    min_uptime_min: NonNegFloat = Field(default=0.0, description="a started worker stays up at least this long, minutes")
    load_s: Optional[NonNegFloat] = Field(default=None, description="seconds from start to serving, every configuration")
    storage_gb_s: Optional[PosFloat] = Field(default=None, description=(
        "read bandwidth a worker loads its weights at, GB/s: load_s = engine_start_s + weight bytes / bandwidth"))
    engine_start_s: NonNegFloat = Field(default=0.0, description="engine start-up besides the weights (s), with storage_gb_s")


class TrafficIn(_In):
    windows: Optional[list[WindowIn]] = Field(default=None, min_length=1, description="a day plan's windows")
    window_min: Optional[PosFloat] = Field(default=None, description="day plan: split the trace into windows this long, minutes")
    rate_rps: Union[float, list[float], None] = None
    isl: Optional[Tokens] = None
    osl: Optional[Annotated[int, Field(strict=True, ge=2, le=MAX_TOKENS)]] = None
    classes: Optional[list[ClassIn]] = Field(default=None, min_length=1)
    trace: Optional[str] = None
    trace_requests: Optional[PosInt] = None
    concurrency: Optional[Annotated[int, Field(strict=True, ge=1, le=100_000)]] = None
    start: Optional[Literal["together", "staggered"]] = Field(default=None, description=(
        "closed loop: together (every user's first request at time 0, as vllm bench serve --max-concurrency "
        "sends them; default) or staggered (first requests spread evenly over one zero-load request time: "
        "desynchronised users in steady state)"))
    length_low_fraction: Optional[Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]] = Field(default=None, description=(
        "each request's ISL and OSL drawn independently and uniformly from the integers [floor(f x L), L] of its "
        "class's isl / osl L (a benchmark client's --random-range-ratio f in InferenceMAX's and vLLM's "
        "benchmark_serving.py up to 0.8; default: the lengths exactly)"))
    prefix_tokens: Optional[Annotated[int, Field(strict=True, ge=1, le=MAX_TOKENS)]] = Field(default=None, description=(
        "tokens of a prompt prefix shared by the requests (a system prompt), served from the prefix cache on a hit"))
    cache_hit_rate: Optional[Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]] = Field(default=None, description=(
        "share of requests whose prefix_tokens are in the worker's prefix cache (vLLM prefix caching, SGLang RadixAttention)"))


class FixedWorkerIn(_In):
    """One worker group of a fixed plan (``serving.fixed.workers[i]``)."""

    role: Literal["aggregated", "prefill", "decode"]
    count: PosInt = Field(default=1, description="workers of this layout")
    tp: PosInt = Field(description="tensor-parallel size (attention; with dp, the worker's GPUs are tp x dp)")
    dp: PosInt = Field(default=1, description="attention data-parallel ranks")
    ep: Optional[PosInt] = None
    cp: PosInt = Field(default=1, description="context-parallel ranks (prefill workers only)")
    sp: bool = Field(default=False, description="Megatron sequence parallelism in the TP group (needs tp > 1)")
    max_batch: Optional[PosInt] = None
    pool: Optional[str] = Field(default=None, min_length=1, description="pool name (GPU); required when the "
                                                                       "instance has more than one pool")


class FixedIn(_In):
    """``serving.fixed``: a plan to evaluate without optimising (``optimize estimate``)."""

    workers: list[FixedWorkerIn] = Field(min_length=1)


class SloIn(_In):
    ttft_ms: PosFloat
    tpot_ms: PosFloat
    percentile: Annotated[float, Field(ge=50, lt=100, description=(
        "the latency percentile the targets hold at, in percent (90 for p90; 0.9 is refused, not read as p0.9)"))] = 90.0
    attainment: Annotated[float, Field(gt=0, lt=1)] = 0.9


class EfficiencyIn(_In):
    compute: Annotated[float, Field(gt=0, le=1)] = 1.0
    memory: Annotated[float, Field(gt=0, le=1)] = 1.0
    network: Annotated[float, Field(gt=0, le=1)] = 1.0


class RoleIn(_In):
    tp: Optional[list[PosInt]] = Field(default=None, min_length=1)
    max_gpus: Optional[PosInt] = Field(default=None, description=(
        "most GPUs per worker of this role (default: one server); above a server's GPUs, MoE workers also "
        "span whole servers with wide EP (attention TP inside a server x DP, EP over all the GPUs)"))
    cp: Optional[list[PosInt]] = Field(default=None, min_length=1, description=(
        "context-parallel degrees tried for prefill workers (chapter 6.2.4), e.g. [1, 2, 4, 8]; default [1] (no CP)"))
    sp: bool = Field(default=False, description=(
        "run this role's TP > 1 workers with Megatron sequence parallelism (chapter 6.2.3; label 'TP8 SP'): "
        "each AllReduce a ReduceScatter + AllGather, same ring time; TP1 workers stay as they are"))


class SimulationIn(_In):
    enabled: bool = True
    requests: Annotated[int, Field(strict=True, ge=50, le=200_000)] = 1500
    seed: Annotated[int, Field(strict=True, ge=0, le=2**63 - 1, description="seed of the simulated arrivals (numpy: 0 or more)")] = 1


class SpeculativeIn(_In):
    """``serving.speculative``: speculative decoding (:mod:`optimizer.model.speculative`); the
    values are checked there, one line per field."""

    method: Any = Field(description="mtp (the checkpoint's MTP layers), eagle (a one-layer draft head) or draft")
    tokens: Any = Field(description="k, tokens drafted per step (1 to 16)")
    acceptance: Any = Field(description="per-token acceptance rate a in (0, 1]: tokens per step (1 - a^(k+1))/(1 - a)")
    draft_config: Optional[str] = Field(default=None, min_length=1, description=(
        "HF config.json of the draft model (draft) or EAGLE head (eagle; default: one layer shaped like the target's)"))
    draft_hf_id: Optional[str] = Field(default=None, min_length=1, description="the draft's model name in launch flags")


class ServingIn(_In):
    traffic: TrafficIn
    slo: SloIn
    mode: Literal["aggregated", "disaggregated", "both"] = "both"
    objective: Optional[str] = None
    chunk_tokens: Annotated[int, Field(strict=True, ge=16, le=MAX_TOKENS)] = 2048
    kv_transfer: Literal["request", "layerwise"] = "request"
    reserve_gib_per_gpu: NonNegFloat = 2.0
    max_batch: Annotated[int, Field(strict=True, ge=1, le=100_000)] = 1024
    homogeneous: bool = Field(default=False, description=(
        "at most one worker configuration (layout and GPU) per role: one engine configuration per "
        "role to deploy and route to, as aiconfigurator's answers are"))
    efficiency: EfficiencyIn = EfficiencyIn()
    prefill: RoleIn = RoleIn()
    decode: RoleIn = RoleIn()
    aggregated: RoleIn = RoleIn()
    simulation: SimulationIn = SimulationIn()
    engine: Literal["vllm", "sglang", "both"] = "both"
    fixed: Optional[FixedIn] = None
    startup: Optional[StartupIn] = None
    slo_margin: Literal["none", "band"] = "none"
    cp_kv_exchange: Literal["ring", "allgather"] = Field(default="allgather", description=(
        "how CP prefill ranks see each other's K/V: allgather (SGLang 0.5.14: every rank keeps the whole KV) or ring"))
    cp_ffn: Literal["worker", "rank"] = Field(default="worker", description=(
        "where a CP prefill worker's dense FFN is split: over all its GPUs (worker, SGLang 0.5.14) or per CP rank"))
    comm_overlap: Annotated[float, Field(ge=0, le=1, description=(
        "share of each step's TP AllReduce / All-to-All time hidden under its compute (chapter 6.4.3); 0 = none"))] = 0.0
    micro_batches: Annotated[int, Field(ge=1, le=2, description=(
        "decode steps as 1 batch or 2 micro-batches whose compute and collectives overlap (DeepSeek's two-batch "
        "overlap; SGLang --enable-two-batch-overlap, vLLM --enable-dbo); with 2, comm_overlap must be 0"))] = 1
    contention_kappa: Annotated[float, Field(ge=1, le=2, description=(
        "contention of two overlapped micro-batches: a layer takes kappa x the longer of compute and "
        "communication (1 = none; a measured pair's group over its longer member; above 2 nothing overlaps)"))] = 1.0
    speculative: Optional[SpeculativeIn] = None


class InstanceIn(_In):
    name: Optional[str] = None
    model: ModelIn
    hardware: HardwareIn
    serving: ServingIn
    performance: PerformanceIn = PerformanceIn()


# ----------------------------------------------------------------------------- resolved
@dataclass(frozen=True)
class Pool:
    """One GPU type: ``count`` GPUs in servers of ``hw.server.gpus``; ``price`` $/GPU-hour (None unknown)."""

    name: str
    gpu: str
    server: str
    count: int
    price: Optional[float]
    hw: Hardware
    perf: PerfModel
    steps: Any = None  # StepTimes: analytic (perf + efficiency) or measured (performance.source)


@dataclass(frozen=True)
class Traffic:
    """Request lengths as weighted points ``(isl[i], osl[i], weight[i])`` (weights sum to 1) and,
    for a trace, the arrival times (s) and lengths of every request."""

    isl: np.ndarray
    osl: np.ndarray
    weight: np.ndarray
    source: str
    arrivals: Optional[np.ndarray] = None
    trace_isl: Optional[np.ndarray] = None
    trace_osl: Optional[np.ndarray] = None
    trace_prefix: Optional[np.ndarray] = None  # the trace's prefix_tokens column (tokens reused on a cache hit)
    # serving.traffic.length_low_fraction: the classes (isl, osl, weight) each request is drawn from and
    # the fraction f of its uniform integer lengths [floor(f x L), L]; the points above are their quantiles
    spread: Optional[tuple[np.ndarray, np.ndarray, np.ndarray, float]] = None

    @property
    def mean_isl(self) -> float:
        return float(np.dot(self.isl, self.weight))

    @property
    def mean_osl(self) -> float:
        return float(np.dot(self.osl, self.weight))

    @property
    def scv_isl(self) -> float:
        """Squared coefficient of variation of the prompt length."""
        m = self.mean_isl
        return float(np.dot(self.weight, (self.isl - m) ** 2)) / m ** 2

    def isl_quantile(self, q: float) -> float:
        order = np.argsort(self.isl)
        cum = np.cumsum(self.weight[order])
        i = int(np.searchsorted(cum, q - 1e-12))
        return float(self.isl[order][min(i, len(order) - 1)])

    @property
    def max_len(self) -> int:
        return int((self.isl + self.osl).max())


@dataclass(frozen=True)
class Problem:
    name: str
    path: Path
    model: ModelSpec
    hf_id: str
    pools: tuple[Pool, ...]
    kv_link: LinkSpec
    kv_link_default: bool
    traffic: Traffic
    rates: tuple[float, ...]
    ttft_s: float
    tpot_s: float
    percentile: float
    attainment: float
    mode: str
    objective: str
    chunk_tokens: int
    kv_transfer: str
    reserve_bytes: float
    max_batch: int
    eff: Efficiency
    roles: dict = field(default_factory=dict)  # role -> RoleIn
    simulation: SimulationIn = SimulationIn()
    engine: str = "both"
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    dtypes: Optional[Dtypes] = None  # where weight_dtype and kv_dtype came from (optimizer/model/checkpoint.py)
    performance: Performance = Performance()
    scheduler: str = "chunked"  # the simulator's step make-up (optimizer/serving/simulate.py): chunked | mixed | prefill_first
    kv_admission: str = "reserve"  # reserve | on_demand (KV_ADMISSION), with the scheduler
    slo_margin: Optional[dict] = None  # band: {ttft_ms, tpot_ms asked, band used}; targets divided by (1 + error)
    concurrency: Optional[int] = None  # closed-loop users (serving.traffic.concurrency), rates then empty
    start: str = "together"  # closed loop: together | staggered (serving.traffic.start)
    homogeneous: bool = False  # serving.homogeneous: at most one configuration per role
    fixed: Optional[FixedIn] = None
    prefix: Optional[PrefixReuse] = None  # serving.traffic.prefix_tokens / cache_hit_rate (optimizer/model/prefix.py)
    speculative: Optional[Any] = None  # optimizer.model.speculative.Speculative (serving.speculative), None: off
    windows: tuple = ()  # day plan: the windows (optimizer.serving.windows.Window), empty otherwise
    startup: Any = None  # day plan: optimizer.serving.windows.Startup

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens a decode step emits per request: 1, or the speculative block's
        ``(1 - a^(k+1))/(1 - a)`` (:func:`optimizer.model.speculative.expected_tokens_per_step`)."""
        return self.speculative.tokens_per_step if self.speculative is not None else 1.0

    @property
    def timing(self) -> dict:
        """Which source timed the plan, why, and its measured error band for that (GPU, engine), per
        pool: ``{pool name: {source, why, engine, error_band}}`` (``error_band`` None: uncalibrated)."""
        from optimizer.model.measured import systems
        from optimizer.model.bands import band

        sysmap = systems()
        out = {}
        for pl in self.pools:
            cal = getattr(pl.steps, "cal", None)
            b = cal.band if cal is not None else band(sysmap.get(pl.gpu), self.performance.engine, pl.steps.name)
            out[pl.name] = {"source": pl.steps.name, "calibrated": cal is not None, "why": pl.steps.why,
                            "engine": self.performance.engine, "error_band": b}
        return out

    @property
    def quantile(self) -> float:
        """Quantile each SLO is checked at analytically: ``max(percentile/100, 1-(1-attainment)/2)``
        (union bound: missing TTFT or TPOT each at most half of the allowed misses)."""
        return max(self.percentile / 100.0, 1.0 - (1.0 - self.attainment) / 2.0)


def performance_of(pin: PerformanceIn, serving_engine: str, path: Path) -> Performance:
    """The resolved ``performance:`` block: the engine defaults to ``serving.engine`` when that
    names one engine, else vLLM (:func:`optimizer.model.steptimes.performance_from_input`)."""
    return performance_from_input(pin, serving_engine if serving_engine in ("vllm", "sglang") else "vllm", path)


def _with_band(pools, performance: Performance, ttft_s: float, tpot_s: float, path: Path):
    """``serving.slo_margin: band``: the targets the plan must meet so that it still meets the SLO
    at the pessimistic end of the timing source's measured error band, ``target / (1 + error)``
    (the worst pool's band). Returns ``(ttft_s, tpot_s, margin record)``.

    Raises:
        InputError: a pool whose (GPU, engine, source) has no band in instances/hardware/fidelity.yaml.
    """
    from optimizer.model.measured import systems
    from optimizer.model.bands import band

    sysmap = systems()
    et = ep = 0.0
    for pl in pools:
        b = band(sysmap.get(pl.gpu), performance.engine, pl.steps.name)
        if b is None:
            raise InputError(path, "serving.slo_margin", f"no measured error band for {pl.gpu} with {performance.engine} "
                                                         f"under the {pl.steps.name} source (instances/hardware/fidelity.yaml): "
                                                         f"uncalibrated, use slo_margin: none")
        et, ep = max(et, b["ttft_median_abs_error"]), max(ep, b["tpot_median_abs_error"])
    return (ttft_s / (1 + et), tpot_s / (1 + ep),
            {"ttft_ms_asked": ttft_s * 1e3, "tpot_ms_asked": tpot_s * 1e3, "ttft_error": et, "tpot_error": ep})


SCHEDULERS = {"vllm": "mixed", "trtllm": "mixed", "sglang": "prefill_first"}
# how an engine admits a request into its KV cache (optimizer/serving/simulate.py): "reserve" the
# request's whole length at admission (TensorRT-LLM's default GUARANTEED_NO_EVICT capacity
# scheduler; the engine-neutral default, the optimiser's max batch of mean-length requests) or
# "on_demand": admit when the prompt's blocks fit and grow block by block, preempting the newest
# request when a step finds no block left (vLLM's recompute preemption, SGLang's retraction)
KV_ADMISSION = {"vllm": "on_demand", "trtllm": "reserve", "sglang": "on_demand"}


def scheduler_of(pin: PerformanceIn, perf: Performance) -> str:
    """The simulator's scheduler: the engine's (:data:`SCHEDULERS`) when ``performance.engine`` is
    given or the source is not analytic, else ``chunked`` (the engine-neutral default)."""
    if pin.engine is None and perf.source in ANALYTIC:
        return "chunked"
    return SCHEDULERS[perf.engine]


def _validate(raw: dict, path: Path) -> InstanceIn:
    return validate(InstanceIn, raw, path)


def read_trace(path: Path, field_name: str, instance: Path, limit: Optional[int] = None, with_prefix: bool = False):
    """Arrival times (s, from 0), input and output tokens of a trace CSV (see module docstring);
    ``with_prefix``: also the optional ``prefix_tokens`` column (tokens of each prompt shared with
    other requests, a cache hit's reuse; None when the trace has no such column).

    Raises:
        InputError: missing file, missing columns, a bad number or time on a line.
    """
    existing_file(instance, field_name, path, "trace file")
    try:
        t, isl, osl, pre = _read_trace_rows(path, limit)
        return (t, isl, osl, pre) if with_prefix else (t, isl, osl)
    except UnicodeDecodeError as exc:
        raise InputError(path, "", f"not a text CSV file ({exc.reason} at byte {exc.start})") from None
    except csv.Error as exc:
        raise InputError(path, "", f"not a readable CSV file ({exc})") from None


def _read_trace_rows(path: Path, limit: Optional[int]):
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise InputError(path, "", "empty trace (expected a header line)") from None
        cols = None
        for names, kind in ((("arrival_s", "input_tokens", "output_tokens"), "seconds"),
                            (("TIMESTAMP", "ContextTokens", "GeneratedTokens"), "datetime")):
            if all(n in header for n in names):
                cols = [header.index(n) for n in names], kind
                break
        if cols is None:
            raise InputError(path, "header", "missing columns: expected arrival_s, input_tokens, output_tokens "
                                             f"or TIMESTAMP, ContextTokens, GeneratedTokens (got {', '.join(header)})")
        (ia, ii, io), kind = cols
        ip = header.index("prefix_tokens") if "prefix_tokens" in header else None
        t, isl, osl, pre = [], [], [], []
        for n, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            try:
                a = row[ia].strip()
                when = float(a) if kind == "seconds" else datetime.fromisoformat(a[:26]).timestamp()
                n_in, n_out = int(row[ii]), int(row[io])
            except (ValueError, IndexError):
                raise InputError(path, f"line {n}", f"cannot read arrival time and token counts from {row!r}") from None
            if not math.isfinite(when):
                raise InputError(path, f"line {n}", f"arrival time must be a finite number of seconds (got {a!r})")
            if n_in < 0 or n_out < 0:
                raise InputError(path, f"line {n}", f"token counts must not be negative (got {n_in}, {n_out})")
            if ip is not None:
                try:
                    k = int(row[ip])
                except (ValueError, IndexError):
                    raise InputError(path, f"line {n}", f"cannot read prefix_tokens from {row!r}") from None
                if k < 0:
                    raise InputError(path, f"line {n}", f"prefix_tokens must not be negative (got {k})")
                pre.append(k)
            t.append(when)
            isl.append(n_in)
            osl.append(n_out)
            if limit is not None and len(t) >= limit:
                break
    if len(t) < 2:
        raise InputError(path, "", "a trace needs at least two requests")
    t = np.asarray(t) - min(t)  # from the earliest arrival (an unsorted trace used to start below 0)
    pre = np.asarray(pre) if ip is not None else None
    if np.any(np.diff(t) < 0):
        order = np.argsort(t, kind="stable")
        t, isl, osl = t[order], np.asarray(isl)[order], np.asarray(osl)[order]
        pre = pre[order] if pre is not None else None
    isl, osl = np.asarray(isl), np.asarray(osl)
    # a request with fewer than two output tokens has no TPOT: counted with two (first token +
    # one decode); an empty prompt with one token. Said, not silent
    short, empty = int(np.sum(osl < 2)), int(np.sum(isl < 1))
    if short or empty:
        from optimizer.errors import warn_input

        if short:
            warn_input(path, "output_tokens", f"{short} of {len(osl)} requests with fewer than 2 output tokens "
                                              f"counted as 2 (no TPOT otherwise)")
        if empty:
            warn_input(path, "input_tokens", f"{empty} of {len(isl)} requests with no input tokens counted as 1")
    return t, np.maximum(isl, 1), np.maximum(osl, 2), pre


SPREAD_POINTS = 8  # quantile points per length and class standing for uniform lengths in the analytic model


def uniform_lengths(low: int, high: int, n: int = SPREAD_POINTS) -> np.ndarray:
    """``n`` equal-weight quantile points (bin midpoints) of the uniform distribution on the
    integers ``[low, high]``, tokens; shape ``(n,)``."""
    q = (np.arange(n) + 0.5) / n
    return np.floor(low + q * (high - low + 1)).clip(low, high).astype(float)


def length_bounds(length: float, fraction: float, least: int) -> tuple[int, int]:
    """The integers ``[max(least, floor(fraction x length)), length]`` a request's length is drawn from."""
    return max(least, int(math.floor(fraction * length))), int(length)


def spread_lengths(t: Traffic, fraction: float) -> Traffic:
    """``t``'s classes with uniform lengths ``[floor(fraction x L), L]`` (``serving.traffic.length_low_fraction``):
    for the analytic model each class becomes ``SPREAD_POINTS`` x ``SPREAD_POINTS`` weighted points
    (ISL and OSL independent); the simulation draws every request's lengths exactly (``Traffic.spread``)."""
    isl, osl, w = [], [], []
    for L_in, L_out, share in zip(t.isl, t.osl, t.weight):
        a = uniform_lengths(*length_bounds(L_in, fraction, 1))
        b = uniform_lengths(*length_bounds(L_out, fraction, 2))
        isl.append(np.repeat(a, len(b)))
        osl.append(np.tile(b, len(a)))
        w.append(np.full(len(a) * len(b), share / (len(a) * len(b))))
    return Traffic(np.concatenate(isl), np.concatenate(osl), np.concatenate(w),
                   f"{t.source}, lengths uniform from {fraction:g} x", spread=(t.isl, t.osl, t.weight, fraction))


def _traffic(tr: TrafficIn, path: Path) -> tuple[Traffic, tuple[float, ...]]:
    given = [k for k in ("isl", "classes", "trace") if getattr(tr, k) is not None]
    if len(given) != 1:
        raise InputError(path, "serving.traffic", "give exactly one of isl/osl, classes or trace")
    rates = tr.rate_rps
    rate_list = None if rates is None else ([rates] if isinstance(rates, (int, float)) else list(rates))
    if rate_list is not None and len(set(rate_list)) < len(rate_list):
        twice = sorted({r for r in rate_list if rate_list.count(r) > 1})
        raise InputError(path, "serving.traffic.rate_rps", f"lists {', '.join(f'{r:g}' for r in twice)} more than once")
    if rate_list is not None:
        if not rate_list:
            raise InputError(path, "serving.traffic.rate_rps", "empty list")
        for i, r in enumerate(rate_list):
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r <= 0:
                raise InputError(path, "serving.traffic.rate_rps", f"must be a positive number of requests/s (got {r!r})")
    if tr.concurrency is not None:
        if rate_list is not None:
            raise InputError(path, "serving.traffic.concurrency", "give either rate_rps (open loop) or concurrency "
                                                                  "(closed loop), not both (rate_rps: null clears a "
                                                                  "base's or --set's rate)")
        if tr.trace is not None:
            raise InputError(path, "serving.traffic.concurrency", "a trace carries its own arrivals; closed-loop "
                                                                  "traffic takes isl/osl or classes")
    if tr.start is not None and tr.concurrency is None:
        raise InputError(path, "serving.traffic.start", "applies to closed-loop traffic (concurrency) only")
    if tr.trace_requests is not None and tr.trace is None:
        raise InputError(path, "serving.traffic.trace_requests", "applies to a trace only")
    if tr.isl is not None:
        if tr.osl is None:
            raise InputError(path, "serving.traffic.osl", "required field is missing (with isl)")
        t = Traffic(np.array([float(tr.isl)]), np.array([float(tr.osl)]), np.array([1.0]), f"isl {tr.isl}, osl {tr.osl}")
    elif tr.osl is not None:
        raise InputError(path, "serving.traffic.osl", "osl goes with isl (classes carry their own)")
    elif tr.classes is not None:
        w = np.array([c.share for c in tr.classes])
        if abs(w.sum() - 1.0) > 1e-6:
            raise InputError(path, "serving.traffic.classes", f"shares must add up to 1 (got {w.sum():g})")
        t = Traffic(np.array([float(c.isl) for c in tr.classes]), np.array([float(c.osl) for c in tr.classes]), w,
                    f"{len(w)} classes")
    else:
        p = Path(tr.trace)
        p = p if p.is_absolute() else path.parent / p
        arr, isl, osl, pre = read_trace(p, "serving.traffic.trace", path, tr.trace_requests, with_prefix=True)
        # the analytic model uses the length distribution as at most 64 weighted quantile points
        qs = (np.arange(64) + 0.5) / 64
        isl_q = np.quantile(isl, qs, method="inverted_cdf").astype(float)
        osl_q = np.quantile(osl, qs, method="inverted_cdf").astype(float)
        # marginals only: the analytic model treats ISL and OSL as independent (the simulation replays pairs)
        t = Traffic(isl_q, osl_q, np.full(64, 1 / 64), f"trace {p.name} ({len(arr)} requests)", arr, isl, osl, pre)
        if rate_list is None:
            span = float(arr[-1] - arr[0])
            if span <= 0:
                raise InputError(p, "", "all arrivals at the same time: give serving.traffic.rate_rps")
            rate_list = [(len(arr) - 1) / span]
    if tr.length_low_fraction is not None:
        if tr.trace is not None:
            raise InputError(path, "serving.traffic.length_low_fraction", "a trace carries its own lengths; "
                                                                         "this applies to isl/osl or classes")
        t = spread_lengths(t, tr.length_low_fraction)
    if tr.concurrency is not None:
        from dataclasses import replace as _replace

        t = _replace(t, source=f"{t.source}, closed loop of {tr.concurrency} users")
    if rate_list is None and tr.concurrency is None:
        raise InputError(path, "serving.traffic.rate_rps", "required field is missing (only a trace has its own rate; "
                                                           "or give concurrency for closed-loop traffic)")
    return t, tuple(float(r) for r in rate_list or ())


def _pools(hw: HardwareIn, model: ModelSpec, wd: str, kd: str, reserve: float, path: Path,
           steps_for=None, cp_kv_exchange: str = "ring", comm_overlap: float = 0.0,
           cp_ffn: str = "rank", micro_batches: int = 1, contention_kappa: float = 1.0) -> tuple[Pool, ...]:
    if hw.pools is not None:
        if any(v is not None for v in (hw.gpu, hw.server, hw.servers, hw.dollars_per_gpu_hour)):
            raise InputError(path, "hardware", "give either hardware.pools or hardware.gpu/server/servers, not both")
        items = [(f"hardware.pools[{i}]", p.gpu, p.server, p.count, p.dollars_per_gpu_hour) for i, p in enumerate(hw.pools)]
    else:
        if hw.gpu is None or hw.server is None:
            raise InputError(path, "hardware", "give hardware.gpu and hardware.server (catalog names), or hardware.pools")
        s = lookup("servers", hw.server, path, "hardware.server")
        items = [("hardware", hw.gpu, hw.server, (hw.servers or 1) * int(s["gpus"]), hw.dollars_per_gpu_hour)]
    out = []
    seen = set()
    for where, gpu, server, count, price in items:
        g = lookup("gpus", gpu, path, f"{where}.gpu")
        s = lookup("servers", server, path, f"{where}.server")
        check_gpu_in_server(gpu, server, path, f"{where}.server")
        if count > MAX_SERVERS * int(s["gpus"]):
            field_ = "hardware.servers" if where == "hardware" else f"{where}.count"
            raise InputError(path, field_, f"{count} GPUs is more than {MAX_SERVERS} servers of {server} "
                                           f"({MAX_SERVERS * int(s['gpus'])} GPUs), the limit deployment and serving share")
        name = gpu if gpu not in seen else f"{gpu}#{len(out)}"
        seen.add(gpu)
        link = lambda d: LinkSpec(d["bandwidth_gb_s"] * GB, d["latency_us"] * 1e-6)  # noqa: E731
        h = Hardware(gpu_spec_from_catalog(gpu, g),
                     ServerSpec(server, int(s["gpus"]), link(s["scale_up"]), link(s["scale_out"])), hw.allreduce)
        pm = PerfModel(model, h, DTYPE_BYTES[wd], DTYPE_BYTES[kd], reserve, weight_dtype=wd, kv_dtype=kd,
                       cp_kv_exchange=cp_kv_exchange, comm_overlap=comm_overlap, cp_ffn=cp_ffn,
                       micro_batches=micro_batches, contention_kappa=contention_kappa)
        out.append(Pool(name, gpu, server, count, price if price is not None else g.get("dollars_per_gpu_hour"), h,
                        pm, steps_for(pm, gpu) if steps_for is not None else None))
    return tuple(out)


def _check_cp(cp: Optional[list[int]], role: str, s: ServingIn, path: Path) -> None:
    """``serving.<role>.cp``: context parallelism is modelled for prefill workers only (whole-prompt
    prefill, :func:`optimizer.model.prefill.prefill_terms`); degrees distinct; a CP degree above 1
    needs prefill workers, i.e. ``mode`` disaggregated or both, and measured step times have no CP.

    Raises:
        InputError: one line naming the field.
    """
    if cp is None:
        return
    where = f"serving.{role}.cp"
    if role != "prefill" and any(c != 1 for c in cp):
        raise InputError(path, where, f"context parallelism is modelled for prefill workers only (chunked prefill and "
                                      f"decode on CP ranks are not); use serving.prefill.cp")
    if len(set(cp)) != len(cp):
        raise InputError(path, where, f"degrees must be distinct (got {cp})")
    if role == "prefill" and any(c > 1 for c in cp) and s.mode == "aggregated":
        raise InputError(path, where, "CP prefill workers need disaggregated serving (mode: disaggregated or both)")


def _check_sp(role_in: RoleIn, role: str, path: Path) -> None:
    """``serving.<role>.sp``: sequence parallelism splits a TP group's activations, so a role
    restricted to TP1 (``serving.<role>.tp: [1]``) has no layout to run it on.

    Raises:
        InputError: one line naming the field.
    """
    if role_in.sp and role_in.tp is not None and all(d == 1 for d in role_in.tp):
        raise InputError(path, f"serving.{role}.sp", f"sequence parallelism needs attention TP > 1; serving.{role}.tp "
                                                     f"allows TP1 only")


def _check_micro_batches(s: ServingIn, performance: Performance, path: Path) -> Performance:
    """``serving.micro_batches: 2`` times the overlap itself (``comm_overlap`` must stay 0) and is
    a term of the analytic model: the measured database times one batch per step; returns the
    performance block that times it (:func:`optimizer.model.steptimes.roofline_only`).

    Raises:
        InputError: one line naming the field.
    """
    if s.micro_batches == 1:
        if s.contention_kappa != 1.0:
            raise InputError(path, "serving.contention_kappa", "applies to two micro-batches (serving.micro_batches: 2)")
        return performance
    if s.comm_overlap:
        raise InputError(path, "serving.micro_batches", f"two micro-batches time the overlap of compute and "
                                                        f"communication themselves: set serving.comm_overlap to 0 "
                                                        f"(got {s.comm_overlap})")
    return roofline_only(performance, "serving.micro_batches", "two micro-batches")


def load(raw: dict[str, Any], path: str | Path, objective: Optional[str], objectives: dict) -> Problem:
    """Validate and resolve a ``serving:`` instance.

    Raises:
        InputError: any bad field (file, dotted field, problem), an unknown objective, a trace with
            missing columns, an unknown pool GPU, a request longer than the model's context.
    """
    path = Path(path)
    inst = _validate(raw, path)
    s = inst.serving
    obj = objective or s.objective or next(o.name for o in objectives.values() if o.default)
    if obj not in objectives:
        raise InputError(path, "--objective" if objective else "serving.objective",
                         f"unknown objective '{obj}' for serving (one of {', '.join(objectives)})")
    for f, d in (("model.weight_dtype", inst.model.weight_dtype), ("model.kv_dtype", inst.model.kv_dtype)):
        if d is not None and d not in DTYPE_BYTES:
            raise InputError(path, f, f"unknown dtype {d!r} (one of {', '.join(DTYPE_BYTES)})")
    cfg = Path(inst.model.config)
    cfg = cfg if cfg.is_absolute() else path.parent / cfg
    existing_file(path, "model.config", cfg)
    rope = inst.model.rope_scaling
    if rope is not None and rope.rope_type == "yarn" and rope.original_max_position_embeddings is None:
        raise InputError(path, "model.rope_scaling.original_max_position_embeddings",
                         "YaRN needs the original context length (e.g. 32768 for Qwen3)")
    spec = read_hf_config(cfg, rope.model_dump(exclude_none=True) if rope is not None else None)
    from optimizer.model.layout import Layout, layout_problem

    for role in ("prefill", "decode", "aggregated"):  # a degree that cannot split the heads is a typo, as in deployment
        for d in getattr(s, role).tp or ():
            bad = layout_problem(spec, Layout.tp(d))
            if bad is not None:
                raise InputError(path, f"serving.{role}.tp", bad[1])
        _check_cp(getattr(s, role).cp, role, s, path)
        _check_sp(getattr(s, role), role, path)
    reserve = s.reserve_gib_per_gpu * GIB
    e = s.efficiency
    eff = Efficiency(e.compute, e.memory, e.network)
    performance = performance_of(inst.performance, s.engine, path)
    from optimizer.launch import check_engine_version

    check_engine_version(performance)
    from optimizer.launch import DEFAULT_VERSION

    # dtypes not given: the checkpoint's, and the KV cache the engine that times the plan keeps for it
    dtypes = resolve_dtypes(cfg, performance.engine, performance.engine_version or DEFAULT_VERSION.get(performance.engine),
                            weight_dtype=inst.model.weight_dtype, kv_dtype=inst.model.kv_dtype,
                            mla=spec.mla is not None, instance=path)
    wd, kd = dtypes.weight_dtype, dtypes.kv_dtype
    spec_dec = None
    if s.speculative is not None:
        from optimizer.model.speculative import resolve as resolve_speculative

        si = s.speculative
        spec_dec = resolve_speculative(si.method, si.tokens, si.acceptance, spec, path, "serving.speculative",
                                       si.draft_config, si.draft_hf_id)

    def steps_for(pm: PerfModel, gpu: str):
        from optimizer.model.speculative import speculative_steps

        return speculative_steps(resolve_steps(performance, pm, cfg, gpu, eff, wd, kd, inst.model.hf_id), spec_dec,
                                 pm, eff)

    performance = _check_micro_batches(s, performance, path)
    pools = _pools(inst.hardware, spec, wd, kd, reserve, path, steps_for, s.cp_kv_exchange, s.comm_overlap, s.cp_ffn,
                   s.micro_batches, s.contention_kappa)
    if s.prefill.cp and max(s.prefill.cp) > 1:
        small = min(p.hw.server.gpus for p in pools)
        if max(s.prefill.cp) > small:
            raise InputError(path, "serving.prefill.cp", f"CP{max(s.prefill.cp)} needs {max(s.prefill.cp)} GPUs per "
                                                         f"worker at TP1; a server has {small} (workers stay in one server)")
    windows, startup = (), None
    if s.traffic.start is not None and s.traffic.concurrency is None:
        raise InputError(path, "serving.traffic.start", "applies to closed-loop traffic (concurrency) only")
    if s.traffic.windows is not None or s.traffic.window_min is not None:  # a day plan
        from optimizer.serving.windows import day_traffic, startup_of

        traffic, rates, windows = day_traffic(s, path, objectives[obj], Traffic, _traffic)
        if s.homogeneous:
            raise InputError(path, "serving.homogeneous", "not supported by a day plan (its MILP has no such rows yet)")
        startup = startup_of(s.startup, path)
    elif s.startup is not None:
        raise InputError(path, "serving.startup", "applies to a day plan only (serving.traffic.windows or window_min)")
    else:
        traffic, rates = _traffic(s.traffic, path)
    if spec.max_context is not None and traffic.max_len > spec.max_context:
        raise InputError(path, "serving.traffic", f"a request of {traffic.max_len} tokens (isl + osl) exceeds the model's "
                                                  f"maximum length {spec.max_context}")
    if obj == "dollars":
        for i, p in enumerate(pools):
            if p.price is None:
                raise InputError(path, f"hardware.pools[{i}].dollars_per_gpu_hour",
                                 f"objective dollars needs a price for {p.gpu} (the catalog has none)")
    kl = inst.hardware.kv_link
    if kl is None:
        lat = max(p.hw.server.scale_out.alpha_s for p in pools)
        link = LinkSpec(DEFAULT_KV_LINK_GB_S * GB, lat)
    else:
        link = LinkSpec(kl.bandwidth_gb_s * GB, kl.latency_us * 1e-6)
    ttft_s, tpot_s, margin = s.slo.ttft_ms * 1e-3, s.slo.tpot_ms * 1e-3, None
    if s.slo_margin == "band":
        ttft_s, tpot_s, margin = _with_band(pools, performance, ttft_s, tpot_s, path)
    if windows:
        life = ttft_s + traffic.mean_osl * tpot_s  # a request's lifetime at the SLO, s
        # a split trace's last window ends with the trace and may be short by itself
        body = windows[:-1] if s.traffic.window_min is not None and len(windows) > 1 else windows
        short = min(w.length_s for w in body)
        if short < life:
            from optimizer.errors import warn_input

            warn_input(path, "serving.traffic.windows" if s.traffic.windows else "serving.traffic.window_min",
                       f"a window of {short:g} s is shorter than a request's lifetime at the SLO ({life:.3g} s: "
                       "TTFT + mean OSL x TPOT): requests run past their window, which the day plan does not "
                       "carry over, so its GPU-hours are low")
    scheduler = scheduler_of(inst.performance, performance)
    return Problem(
        name=inst.name or path.stem, path=path, model=spec, hf_id=inst.model.hf_id or HF_ID_PLACEHOLDER,
        pools=pools, kv_link=link, kv_link_default=kl is None, traffic=traffic, rates=rates,
        ttft_s=ttft_s, tpot_s=tpot_s, percentile=s.slo.percentile,
        attainment=s.slo.attainment, mode=s.mode, objective=obj, chunk_tokens=s.chunk_tokens,
        kv_transfer=s.kv_transfer, reserve_bytes=reserve, max_batch=s.max_batch,
        eff=eff,
        roles={"prefill": s.prefill, "decode": s.decode, "aggregated": s.aggregated},
        simulation=s.simulation,
        # the launch commands' engines: serving.engine, else the one performance.engine times the plan with
        engine=(s.engine if "engine" in s.model_fields_set or inst.performance is None
                or inst.performance.engine not in ("vllm", "sglang") else inst.performance.engine),
        weight_dtype=wd, kv_dtype=kd, dtypes=dtypes, performance=performance,
        slo_margin=margin, concurrency=s.traffic.concurrency, start=s.traffic.start or "together", homogeneous=s.homogeneous, fixed=s.fixed, scheduler=scheduler,
        kv_admission="reserve" if scheduler == "chunked" else KV_ADMISSION[performance.engine],
        prefix=_prefix(s.traffic, traffic, path),
        speculative=spec_dec,
        windows=windows, startup=startup,
    )


def _prefix(tr: TrafficIn, traffic: Traffic, path: Path) -> Optional[PrefixReuse]:
    """``serving.traffic.prefix_tokens`` with ``cache_hit_rate`` (both or neither), or a trace's
    ``prefix_tokens`` column with ``cache_hit_rate``: the analytic model then takes the trace's
    mean prefix (its reused share; the simulation replays each request's own).

    Raises:
        InputError: one given without the other; prefix_tokens both in the trace and the instance.
    """
    col = traffic.trace_prefix
    if col is not None:
        if tr.prefix_tokens is not None:
            raise InputError(path, "serving.traffic.prefix_tokens", "the trace has a prefix_tokens column of its own: "
                                                                    "give one or the other")
        if tr.cache_hit_rate is None:
            raise InputError(path, "serving.traffic.cache_hit_rate", "required with a trace's prefix_tokens column "
                                                                     "(the share of requests whose prefix is cached, 0..1)")
        mean = int(round(float(np.mean(np.minimum(col, np.maximum(traffic.trace_isl - 1, 0))))))
        return PrefixReuse(max(mean, 0), float(tr.cache_hit_rate), per_request=True)
    if tr.prefix_tokens is None and tr.cache_hit_rate is None:
        return None
    if tr.prefix_tokens is None:
        raise InputError(path, "serving.traffic.cache_hit_rate", "goes with prefix_tokens (the shared prefix it hits)")
    if tr.cache_hit_rate is None:
        raise InputError(path, "serving.traffic.prefix_tokens", "needs cache_hit_rate (the share of requests whose "
                                                                "prefix is in the cache, 0..1)")
    shortest = int(np.min(traffic.trace_isl if traffic.trace_isl is not None else traffic.isl))
    if tr.prefix_tokens >= shortest:
        if traffic.arrivals is None:
            raise InputError(path, "serving.traffic.prefix_tokens",
                             f"{tr.prefix_tokens} tokens is not shorter than the shortest prompt ({shortest} tokens): "
                             "the shared prefix is part of every prompt")
        from optimizer.errors import warn_input

        n = int(np.sum((traffic.trace_isl if traffic.trace_isl is not None else traffic.isl) <= tr.prefix_tokens))
        warn_input(path, "serving.traffic.prefix_tokens",
                   f"{n} trace prompts are not longer than the {tr.prefix_tokens}-token prefix; "
                   "each reuses at most its prompt less one token")
    return PrefixReuse(tr.prefix_tokens, float(tr.cache_hit_rate))
