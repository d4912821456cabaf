"""Deployment instance: input schema (pydantic) and the resolved problem (plain data, SI units).

Input units live in field names (``memory_gb``, ``deadline_ms``, ``latency_us``); this
module converts them once, into bytes, seconds, bytes/s and FLOP/s, when the
:class:`Problem` is built. GB is decimal (1e9 B), GiB binary (2**30 B).
"""
from __future__ import annotations

from types import MappingProxyType

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import ConfigDict, Field, field_validator

from optimizer.catalog import check_gpu_in_server, lookup
from optimizer.model.collectives import ACTIVATION_BYTES, AllReduceTable, read_nccl_allreduce_log
from optimizer.deployment.model_config import ModelShape, read_model_config
from optimizer.errors import InputError
from optimizer.launch import MODEL_PLACEHOLDER
from optimizer.model.hardware import peak_flops_for
from optimizer.model.layout import Layout, default_layouts, layout_problem
from optimizer.schema_base import MAX_GPUS_PER_SERVER, MAX_SERVERS  # shared with serving
from optimizer.schema_base import PerformanceIn, RopeScalingIn, StrictModel, existing_file, validate  # shared with serving
from optimizer.model.steptimes import Performance, performance_from_input, roofline_only

# bytes per element of each weight / KV dtype (read-only)
from optimizer.model.checkpoint import Dtypes, resolve as resolve_dtypes  # noqa: E402
from optimizer.model.decode import DTYPE_BYTES as _MODEL_DTYPE_BYTES  # noqa: E402

DTYPE_BYTES = MappingProxyType(_MODEL_DTYPE_BYTES)  # one table: the performance model's
DType = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4"]

GB = 1e9
GIB = 2 ** 30


class _In(StrictModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


# Upper limits keep every quantity inside what the integer models can represent (CP-SAT
# needs |coefficients| well below 2**62 at the 10 ns time resolution) and the model sizes
# inside memory; they are far beyond any real deployment.
MAX_MS = 1e9  # 11.6 days
MAX_TOKENS = 100_000_000
MAX_SESSIONS_PER_GROUP = 100_000
MAX_SESSIONS_TOTAL = 500_000  # over all session groups


class ModelIn(_In):
    config: str = Field(min_length=1, description="HuggingFace config.json, path relative to the instance file")
    weight_dtype: Optional[DType] = Field(default=None, description=(
        "null: the checkpoint's (its quantization_config; bf16 without one), optimizer/model/checkpoint.py"))
    kv_dtype: Optional[DType] = Field(default=None, description=(
        "null: what performance.engine stores for this checkpoint (instances/engines/kv_defaults.yaml)"))
    rope_scaling: Optional[RopeScalingIn] = Field(default=None, description="RoPE scaling enabled at serving time (null: the config's own)")
    hf_id: Optional[str] = Field(default=None, min_length=1, description="model name in the launch commands (null: MODEL)")


class GpuIn(_In):
    name: str
    memory_gb: float = Field(gt=0, le=1e6)
    memory_bandwidth_gb_s: float = Field(gt=0, le=1e7)
    bf16_tflops: float = Field(gt=0, le=1e7, description="dense BF16 tensor-core peak")
    fp8_tflops: Optional[float] = Field(default=None, gt=0, le=1e7,
                                        description="dense FP8 tensor-core peak (null: no FP8, the BF16 peak is used)")
    fp4_tflops: Optional[float] = Field(default=None, gt=0, le=1e7,
                                        description="dense FP4 tensor-core peak (null: no FP4, the BF16 peak is used)")
    power_w: float = Field(gt=0, le=1e6)
    dollars_per_gpu_hour: Optional[float] = Field(default=None, gt=0, le=1e6,
                                                  description="rental or amortised price of one GPU for one hour")


class LinkIn(_In):
    bandwidth_gb_s: float = Field(gt=0, le=1e7, description="per GPU per direction")
    latency_us: float = Field(ge=0, le=1e6, description="per communication round (alpha)")
    allreduce_log: Optional[str] = Field(default=None, description="nccl-tests all_reduce_perf output, relative path")


class ServerIn(_In):
    name: str
    gpus: int = Field(gt=0, le=MAX_GPUS_PER_SERVER)
    power_kw: float = Field(gt=0, le=1e4)
    scale_up: LinkIn
    scale_out: LinkIn


class HardwareIn(_In):
    gpu: Union[str, GpuIn]
    server: Union[str, ServerIn]
    servers: int = Field(default=1, gt=0, le=MAX_SERVERS)
    dollars_per_gpu_hour: Optional[float] = Field(default=None, gt=0, le=1e6,
                                                  description="overrides the GPU's (catalog) price")


class SessionGroupIn(_In):
    name: str = Field(min_length=1)
    count: int = Field(default=1, gt=0, le=MAX_SESSIONS_PER_GROUP)
    context_tokens: int = Field(ge=0, le=MAX_TOKENS, description="tokens already in the KV cache")
    new_tokens: int = Field(gt=0, le=MAX_TOKENS, description="decode steps still to run")
    deadline_ms: Optional[float] = Field(default=None, gt=0, le=MAX_MS, description="finish by this time (inclusive); null: none")

    @field_validator("name")
    @classmethod
    def _no_slash(cls, v: str) -> str:
        if "/" in v:
            raise ValueError("must not contain '/' (session ids are name/index)")
        return v


class WorkloadIn(_In):
    sessions: list[SessionGroupIn] = Field(min_length=1)
    min_on_time_fraction: float = Field(default=1.0, ge=0, le=1)

    @field_validator("sessions")
    @classmethod
    def _total(cls, v: list[SessionGroupIn]) -> list[SessionGroupIn]:
        total = sum(g.count for g in v)
        if total > MAX_SESSIONS_TOTAL:  # 5,000,000 sessions took 12 s to read before any check
            raise ValueError(f"{total:,} sessions in all; at most {MAX_SESSIONS_TOTAL:,}")
        return v


class AttentionLayoutIn(_In):
    tp: int = Field(description="GPUs splitting each attention (TP); required: a layout states its TP degree")
    dp: int = Field(default=1, description="attention replicas, each serving its own sessions (DP attention)")


class ExpertsLayoutIn(_In):
    tp: int = Field(default=1, description="GPUs splitting each routed expert")
    ep: int = Field(default=1, description="groups the routed experts are divided over (EP)")


class LayoutIn(_In):
    """One allowed instance layout (see :class:`optimizer.model.layout.Layout`)."""

    attention: AttentionLayoutIn = Field(description="the attention's split (tp, dp); required")
    experts: Optional[ExpertsLayoutIn] = Field(default=None, description="MoE only; default: follows attention")
    pp: int = Field(default=1, description="pipeline stages")
    cp: int = Field(default=1, description="context-parallel ranks (a power of two): copies of the attention TP x DP group "
                                           "with the same weights, each holding 1/cp of every session's KV")
    sp: bool = Field(default=False, description="Megatron sequence parallelism inside the attention-TP group (needs "
                                                 "attention.tp > 1; label 'TP8 SP'): each AllReduce a ReduceScatter + "
                                                 "AllGather, the same ring time")
    gpus: Optional[int] = Field(default=None, description="GPUs of the instance (checked: pp x attention.tp x attention.dp x cp)")


class DeploymentIn(_In):
    reserve_gib_per_gpu: float = Field(default=0.0, ge=0, le=1e6, description="activations and workspace per GPU")
    tensor_parallel: Optional[list[int]] = Field(default=None, min_length=1)
    layouts: Optional[list[LayoutIn]] = Field(default=None, min_length=1,
                                              description="allowed instance layouts (default: see default_layouts)")
    max_batch: Optional[int] = Field(default=None, gt=0, le=MAX_SESSIONS_PER_GROUP,
                                     description="sessions an instance decodes at once (null: no limit beyond memory)")
    allreduce: Literal["ring", "tree", "best", "measured"] = "ring"
    micro_batches: int = Field(default=1, ge=1, le=2, description=(
        "decode steps as 1 batch or 2 micro-batches whose compute and collectives overlap (DeepSeek's two-batch "
        "overlap; SGLang --enable-two-batch-overlap, vLLM --enable-dbo)"))
    contention_kappa: float = Field(default=1.0, ge=1, le=2, description=(
        "contention of two overlapped micro-batches: a layer takes kappa x the longer of compute and communication "
        "(1 = none; a measured pair's group over its longer member; above 2 nothing overlaps)"))

    @field_validator("tensor_parallel")
    @classmethod
    def _positive_unique(cls, v):
        if v is None:
            return v
        for p in v:
            if p <= 0:
                raise ValueError(f"degrees must be positive (got {p})")
        if len(set(v)) != len(v):
            raise ValueError("degrees must be distinct")
        return sorted(v)


class FaultIn(_In):
    gpu: Optional[int] = Field(default=None, ge=0, description="global GPU index (server*gpus + local); null: any GPU")
    at_ms: float = Field(ge=0, le=MAX_MS)
    stall_ms: float = Field(gt=0, le=MAX_MS)


class InstanceIn(_In):
    name: str = ""
    model: ModelIn
    hardware: HardwareIn
    workload: WorkloadIn
    deployment: DeploymentIn = DeploymentIn()
    faults: list[FaultIn] = Field(default_factory=list)
    performance: PerformanceIn = PerformanceIn()


# ----------------------------------------------------------------------------- resolved


@dataclass(frozen=True)
class Gpu:
    """A GPU in SI units: bytes, bytes/s, FLOP/s, watts. ``peak_flops`` is the dense BF16 peak,
    ``fp8_flops`` / ``fp4_flops`` the optional dense FP8 / FP4 peaks (``None``: none)."""

    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    peak_flops: float
    power_w: float
    dollars_per_gpu_hour: Optional[float] = None
    fp8_flops: Optional[float] = None
    fp4_flops: Optional[float] = None

    def peak_flops_for(self, dtype: Optional[str]) -> float:
        """Dense peak (FLOP/s) for matrix products in ``dtype`` (:func:`optimizer.model.hardware.peak_flops_for`)."""
        return peak_flops_for(self, dtype)


@dataclass(frozen=True)
class Link:
    """One network tier, per GPU per direction: bytes/s and seconds per round."""

    bandwidth_bytes_per_s: float
    alpha_s: float
    table: Optional[AllReduceTable] = None


@dataclass(frozen=True)
class Server:
    name: str
    gpus: int
    power_w: float
    scale_up: Link
    scale_out: Link


@dataclass(frozen=True)
class Session:
    id: str
    group: str
    context: int
    new: int
    deadline_s: Optional[float]
    cls: int  # index of its session class


@dataclass(frozen=True)
class SessionClass:
    """Sessions that are interchangeable for the solver (same context, new tokens, deadline)."""

    index: int
    context: int
    new: int
    deadline_s: Optional[float]
    session_ids: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.session_ids)


@dataclass(frozen=True)
class Fault:
    gpu: Optional[int]
    at_s: float
    stall_s: float


@dataclass(frozen=True)
class Problem:
    """A resolved deployment problem: plain data in SI units, no solver objects."""

    name: str
    path: Path
    model: ModelShape
    weight_bytes: float  # bytes per parameter
    kv_bytes: float  # bytes per KV element
    gpu: Gpu
    server: Server
    servers: int
    sessions: tuple[Session, ...]
    classes: tuple[SessionClass, ...]
    min_on_time_fraction: float
    reserve_bytes: float
    degrees: tuple[int, ...]
    degrees_given: bool
    allreduce: str
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    layouts: tuple[Layout, ...] = ()
    layouts_given: bool = False
    max_batch: Optional[int] = None  # None: no limit beyond memory
    weight_dtype: Optional[str] = None  # dtype names (the tensor-core peaks); None: the BF16 peak
    kv_dtype: Optional[str] = None
    dtypes: Optional[Dtypes] = None  # where weight_dtype and kv_dtype came from (optimizer/model/checkpoint.py)
    hf_id: str = MODEL_PLACEHOLDER  # the model in the launch commands
    rope_scaling: Optional[dict] = None  # model.rope_scaling as given (the launch commands pass it on)
    micro_batches: int = 1  # decode steps as 1 batch or 2 overlapped micro-batches (PerfModel.micro_batches)
    contention_kappa: float = 1.0  # their contention factor (PerfModel.contention_kappa)
    performance: Performance = Performance()  # the step-time source (optimizer.model.steptimes)
    config_file: Optional[Path] = None  # model.config resolved (the measured source reads it)
    gpu_catalog: Optional[str] = None  # hardware.gpu's catalog name (None: inline; no measured tables)

    @property
    def batch_cap(self) -> int:
        """The batch limit an instance may use (the session count when unlimited)."""
        return len(self.sessions) if self.max_batch is None else min(self.max_batch, len(self.sessions))

    @property
    def tp_only(self) -> bool:
        """True for today's problem: plain TP layouts, one session at a time per instance."""
        return self.batch_cap == 1 and all(lay == Layout.tp(lay.attention_tp) for lay in self.layouts)

    @property
    def total_gpus(self) -> int:
        return self.server.gpus * self.servers

    @property
    def required_on_time(self) -> int:
        """``ceil(fraction * N)`` sessions must finish by their deadline (inclusive)."""
        n = len(self.sessions)
        return min(n, math.ceil(self.min_on_time_fraction * n - 1e-9))


def _resolve_path(base: Path, rel: str) -> Path:
    p = Path(rel)
    return p if p.is_absolute() else (base.parent / p)


def _existing(base: Path, rel: str, field_name: str) -> Path:
    return existing_file(base, field_name, _resolve_path(base, rel))


def _link(data: LinkIn, base: Path, field_name: str) -> Link:
    table = None
    if data.allreduce_log:
        table = read_nccl_allreduce_log(_existing(base, data.allreduce_log, f"{field_name}.allreduce_log"))
    return Link(data.bandwidth_gb_s * GB, data.latency_us * 1e-6, table)


def _validate(cls, data: dict[str, Any], file: Path, prefix: str):
    return validate(cls, data, file, prefix)


def build_problem(raw: dict[str, Any], path: Path) -> Problem:
    """Validate a raw instance mapping and resolve it into a :class:`Problem`.

    Catalog names are looked up in ``instances/hardware/catalog.yaml``; ``model.config`` and
    ``allreduce_log`` paths are relative to the instance file.

    Raises:
        InputError: any bad field (file, dotted field and problem in the message).
    """
    path = Path(path)
    inst: InstanceIn = _validate(InstanceIn, raw, path, "")
    hw = inst.hardware
    gpu_in = hw.gpu if isinstance(hw.gpu, GpuIn) else _validate(GpuIn, lookup("gpus", hw.gpu, path, "hardware.gpu"), path, "hardware.gpu")
    if isinstance(hw.server, ServerIn):
        server_in = hw.server
    else:
        server_in = _validate(ServerIn, lookup("servers", hw.server, path, "hardware.server"), path, "hardware.server")
        if isinstance(hw.gpu, str):
            check_gpu_in_server(hw.gpu, hw.server, path, "hardware.server")
    price = hw.dollars_per_gpu_hour if hw.dollars_per_gpu_hour is not None else gpu_in.dollars_per_gpu_hour
    gpu = Gpu(gpu_in.name, gpu_in.memory_gb * GB, gpu_in.memory_bandwidth_gb_s * GB, gpu_in.bf16_tflops * 1e12,
              gpu_in.power_w, price, *(None if t is None else t * 1e12 for t in (gpu_in.fp8_tflops, gpu_in.fp4_tflops)))
    server = Server(server_in.name, server_in.gpus, server_in.power_kw * 1e3,
                    _link(server_in.scale_up, path, "hardware.server.scale_up"),
                    _link(server_in.scale_out, path, "hardware.server.scale_out"))
    rope = inst.model.rope_scaling
    if rope is not None and rope.rope_type == "yarn" and rope.original_max_position_embeddings is None:
        raise InputError(path, "model.rope_scaling.original_max_position_embeddings",
                         "YaRN needs the original context length (e.g. 32768 for Qwen3)")
    shape = read_model_config(_existing(path, inst.model.config, "model.config"),
                              rope.model_dump(exclude_none=True) if rope is not None else None)
    message = shape.hidden * ACTIVATION_BYTES
    for tier, link in (("scale_up", server.scale_up), ("scale_out", server.scale_out)):
        t = link.table
        if t is not None and t.size_bytes[-1] < message:
            raise InputError(path, f"hardware.server.{tier}.allreduce_log",
                             f"{t.path} measures up to {int(t.size_bytes[-1])} B, less than the AllReduce message "
                             f"of {message:.0f} B (hidden_size {shape.hidden} x {ACTIVATION_BYTES:.0f} B)")

    if shape.max_context is not None:
        for i, g in enumerate(inst.workload.sessions):
            if g.context_tokens + g.new_tokens > shape.max_context:
                raise InputError(path, f"workload.sessions[{i}].context_tokens",
                                 f"context_tokens {g.context_tokens} + new_tokens {g.new_tokens} = "
                                 f"{g.context_tokens + g.new_tokens} tokens exceeds the model's maximum length "
                                 f"{shape.max_context} ({shape.max_context_source}; set model.rope_scaling to extend it)")
    names = [g.name for g in inst.workload.sessions]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise InputError(path, "workload.sessions", f"session group name '{sorted(dup)[0]}' is used twice")
    sessions: list[Session] = []
    class_index: dict[tuple, int] = {}
    class_ids: list[list[str]] = []
    for g in inst.workload.sessions:
        deadline = g.deadline_ms * 1e-3 if g.deadline_ms is not None else None
        key = (g.context_tokens, g.new_tokens, deadline)
        if key not in class_index:
            class_index[key] = len(class_ids)
            class_ids.append([])
        c = class_index[key]
        for i in range(g.count):
            sid = f"{g.name}/{i}"
            sessions.append(Session(sid, g.name, g.context_tokens, g.new_tokens, deadline, c))
            class_ids[c].append(sid)
    classes = tuple(SessionClass(i, k[0], k[1], k[2], tuple(class_ids[i])) for k, i in class_index.items())

    total = server.gpus * hw.servers
    dep = inst.deployment
    if dep.tensor_parallel is not None and dep.layouts is not None:
        raise InputError(path, "deployment.layouts", "give either deployment.tensor_parallel (TP shorthand) or deployment.layouts, not both")
    if dep.tensor_parallel is not None:
        degrees = tuple(dep.tensor_parallel)
        given = True
        layouts = tuple(Layout.tp(p) for p in degrees)
        for p in degrees:  # the model's heads, as deployment.layouts[i].attention.tp (a degree beyond
            bad = layout_problem(shape, Layout.tp(p))  # the GPUs is a limit instead: infeasible, exit 3)
            if bad:
                raise InputError(path, "deployment.tensor_parallel", bad[1])
    elif dep.layouts is not None:
        layouts = tuple(_layout(shape, lay_in, path, f"deployment.layouts[{i}]") for i, lay_in in enumerate(dep.layouts))
        if len(set(layouts)) != len(layouts):
            raise InputError(path, "deployment.layouts", "a layout is listed twice")
        degrees = tuple(sorted({lay.gpus for lay in layouts if lay == Layout.tp(lay.gpus)}))
        given = True
    else:
        degrees = tuple(2 ** i for i in range(0, 64) if 2 ** i <= total)
        given = False
        layouts = tuple(default_layouts(shape, total, server.gpus))
    for i, f in enumerate(inst.faults):
        if f.gpu is not None and f.gpu >= total:
            raise InputError(path, f"faults[{i}].gpu", f"GPU {f.gpu} does not exist ({total} GPUs: 0..{total - 1})")
    if dep.micro_batches == 1 and dep.contention_kappa != 1.0:
        raise InputError(path, "deployment.contention_kappa", "applies to two micro-batches (deployment.micro_batches: 2)")
    if inst.deployment.allreduce == "measured" and server.scale_out.table is None and server.scale_up.table is None:
        raise InputError(path, "deployment.allreduce", "'measured' needs hardware.server.scale_out.allreduce_log (an nccl-tests all_reduce_perf file)")
    performance = performance_from_input(inst.performance, "vllm", path)
    from optimizer.launch import check_engine_version

    check_engine_version(performance)
    from optimizer.launch import DEFAULT_VERSION

    # dtypes not given: the checkpoint's, and the KV cache the engine that times the plan keeps for it
    config_file = _resolve_path(path, inst.model.config)
    dtypes = resolve_dtypes(config_file, performance.engine,
                            performance.engine_version or DEFAULT_VERSION.get(performance.engine),
                            weight_dtype=inst.model.weight_dtype, kv_dtype=inst.model.kv_dtype,
                            mla=shape.mla is not None, instance=path)
    for name, value, default, what in (("micro_batches", dep.micro_batches, 1, "two micro-batches"),
                                       ("allreduce", dep.allreduce, "ring", f"allreduce: {dep.allreduce}")):
        if value != default:
            performance = roofline_only(performance, f"deployment.{name}", what)

    return Problem(
        name=inst.name or path.stem,
        path=path,
        model=shape,
        weight_bytes=DTYPE_BYTES[dtypes.weight_dtype],
        kv_bytes=DTYPE_BYTES[dtypes.kv_dtype],
        gpu=gpu,
        server=server,
        servers=hw.servers,
        sessions=tuple(sessions),
        classes=classes,
        min_on_time_fraction=inst.workload.min_on_time_fraction,
        reserve_bytes=inst.deployment.reserve_gib_per_gpu * GIB,
        degrees=degrees,
        degrees_given=given,
        allreduce=inst.deployment.allreduce,
        faults=tuple(Fault(f.gpu, f.at_ms * 1e-3, f.stall_ms * 1e-3) for f in inst.faults),
        layouts=layouts,
        layouts_given=given,
        max_batch=dep.max_batch,
        weight_dtype=dtypes.weight_dtype,
        kv_dtype=dtypes.kv_dtype,
        dtypes=dtypes,
        hf_id=inst.model.hf_id or MODEL_PLACEHOLDER,
        rope_scaling=rope.model_dump(exclude_none=True) if rope is not None else None,
        micro_batches=dep.micro_batches,
        contention_kappa=dep.contention_kappa,
        performance=performance,
        config_file=_resolve_path(path, inst.model.config),
        gpu_catalog=hw.gpu if isinstance(hw.gpu, str) else None,
    )


def _layout(m: ModelShape, lay_in: LayoutIn, path: Path, prefix: str) -> Layout:
    """A layout entry resolved and validated against the model (raises InputError naming the field)."""
    a = lay_in.attention
    if lay_in.experts is None:
        etp, eep = (a.tp * a.dp, 1) if m.moe is not None else (a.tp, 1)
    else:
        if m.moe is None:
            raise InputError(path, f"{prefix}.experts", f"{m.name} is a dense model: it has no experts to lay out")
        etp, eep = lay_in.experts.tp, lay_in.experts.ep
    cp = lay_in.cp
    if isinstance(cp, int) and cp >= 1 and cp & (cp - 1):
        raise InputError(path, f"{prefix}.cp", f"must be a power of two (1, 2, 4, ...; got {cp})")
    lay = Layout(a.tp, a.dp, etp, eep, lay_in.pp, cp, lay_in.sp)
    bad = layout_problem(m, lay, lay_in.gpus)
    if bad:
        raise InputError(path, f"{prefix}.{bad[0]}", bad[1])
    return lay
