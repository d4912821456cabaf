"""The ``supernode:`` instance section: strict input schema and the resolved problem.

Input units are in the field names (``memory_gb``, ``latency_us``, ``bandwidth_gb_s``,
``reserve_gib_per_card``); :func:`resolve` converts them once to SI units (bytes, seconds,
bytes/s, FLOP/s) held by :class:`Problem`. GB is 1e9 bytes, GiB 2^30 bytes.

Hardware comes from ``instances/hardware/supernode.yaml`` (a system name, every figure with a
source) with the card from ``instances/hardware/catalog.yaml``, or inline.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, Union

from pydantic import Field, ValidationError

from optimizer.catalog import lookup
from optimizer.errors import InputError

if TYPE_CHECKING:
    from objectives.supernode import SupernodeObjective
from optimizer.model.decode import DecodeInventory
from optimizer.supernode.expert_load import ExpertLoad, ExpertLoadIn, resolve_expert_load
from optimizer.supernode.fabric import FabricSectionIn, FabricSpec, resolve_fabric
from optimizer.schema_base import (MAX_SERVERS, PerformanceIn, StrictModel, existing_file, read_yaml, validate,
                                   validation_error_to_input_error)

PosFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
PosInt = Annotated[int, Field(strict=True, ge=1)]
Name = Annotated[str, Field(strict=True, min_length=1)]

TIER_NAMES = ("hbm", "host", "pool", "rom", "sram")
KV_TIER_NAMES = ("hbm", "host", "pool")
SYSTEMS_FILE = Path(__file__).resolve().parents[2] / "instances" / "hardware" / "supernode.yaml"
GB = 1e9
GIB = 2 ** 30


# ----------------------------------------------------------------------------- input models
class LinkIn(StrictModel):
    bandwidth_gb_s: PosFloat
    latency_us: NonNegFloat


class HostIn(StrictModel):
    capacity_gb_per_server: PosFloat
    round_trip_us: NonNegFloat
    bandwidth_gb_s: PosFloat
    random_reads_per_s: PosFloat


class PoolIn(StrictModel):
    capacity_gb: PosFloat
    round_trip_us: PosFloat
    transaction_bytes: PosInt
    in_flight: PosInt
    path_bandwidth_gb_s: PosFloat


class RomIn(StrictModel):
    capacity_gb_per_card: PosFloat
    latency_per_hop_us: NonNegFloat
    hops: Annotated[int, Field(strict=True, ge=0)]
    bandwidth_gb_s: PosFloat


class SramIn(StrictModel):
    capacity_mb_per_card: PosFloat
    latency_us: NonNegFloat
    bandwidth_gb_s: PosFloat


class TiersIn(StrictModel):
    host: Optional[HostIn] = None
    pool: Optional[PoolIn] = None
    rom: Optional[RomIn] = None
    sram: Optional[SramIn] = None


class CardIn(StrictModel):
    name: Name
    memory_gb: PosFloat
    memory_bandwidth_gb_s: PosFloat
    bf16_tflops: PosFloat
    # dense FP8 / FP4 peaks, carried for the card (the supernode step is timed at bf16_tflops,
    # the reference chapter's eq 6-15 roofline; see Hardware)
    fp8_tflops: Optional[PosFloat] = None
    fp4_tflops: Optional[PosFloat] = None


class SystemIn(StrictModel):
    card: Union[Name, CardIn]
    server_cards: PosInt
    max_scale_up_cards: PosInt
    scale_up: LinkIn
    scale_out: LinkIn
    tiers: TiersIn = TiersIn()
    source: Optional[dict[str, str]] = None


class ModelIn(StrictModel):
    inventory: Optional[Name] = None
    config: Optional[Name] = None
    weight_dtype: Optional[Name] = None
    kv_dtype: Optional[Name] = None


class SupernodeIn(StrictModel):
    system: Union[Name, SystemIn]
    cards: PosInt
    sizes: list[PosInt] = Field(min_length=1)
    allow_cross_server: bool = False
    context_tokens: PosInt
    reserve_gib_per_card: NonNegFloat
    slo_ms_per_token: PosFloat
    overlap_efficiency: Annotated[float, Field(strict=True, gt=0, le=1, allow_inf_nan=False)]
    fixed_us_per_token: NonNegFloat
    # eq 6-15's T_comm: All-to-All exchanges of one token per MoE layer at batch 1. The chapter
    # counts one (dispatch and combine of a single token as one latency-bound exchange: 2.76 ms
    # for V4.1 Flash); 2 counts dispatch and combine separately, as the batch step does (2.80 ms).
    single_user_all_to_all_per_moe_layer: Annotated[int, Field(strict=True, ge=1, le=2)] = 1
    table_tiers: Union[list[Name], dict[str, list[Name]]] = Field(default_factory=lambda: ["hbm"])
    kv_tiers: list[Name] = Field(default_factory=lambda: ["hbm"])
    target_sessions: Optional[PosInt] = None
    # the scale-up fabric as a decision (optimizer/supernode/fabric.py); None: the system's NVLink
    fabric: Optional["FabricSectionIn"] = None
    # routing skew of the All-to-All (optimizer/supernode/expert_load.py); None: uniform routing
    expert_load: Optional[ExpertLoadIn] = None


class InstanceIn(StrictModel):
    name: Optional[Annotated[str, Field(strict=True)]] = None
    model: ModelIn
    supernode: SupernodeIn
    performance: PerformanceIn = PerformanceIn()


# ----------------------------------------------------------------------------- resolved
@dataclass(frozen=True)
class Tier:
    """A memory tier a table (or KV) can live in, in SI units.

    ``scope`` says what ``capacity_bytes`` is per: ``card``, ``server`` or ``system`` (one
    pool shared by every instance). ``latency_s`` is the fixed part of one fetch (a round
    trip, or hops x per-hop latency), ``bandwidth`` the usable bytes/s per card (for the
    pool: eq 6-12), ``reads_per_s`` the random-read rate per server (host only).
    """

    name: str
    scope: str
    capacity_bytes: float
    latency_s: float
    bandwidth: float
    reads_per_s: float | None = None
    transaction_bytes: int | None = None
    detail: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Hardware:
    """A resolved supernode system (SI units)."""

    name: str
    card: str
    memory_bytes: float
    hbm_bandwidth: float
    flops: float
    server_cards: int
    max_scale_up_cards: int
    nvlink_bandwidth: float
    nvlink_latency_s: float
    nic_bandwidth: float
    nic_latency_s: float
    tiers: dict[str, Tier]
    sources: dict[str, str]
    fp8_flops: float | None = None  # the card's dense FP8 / FP4 peaks (FLOP/s); the step uses ``flops``
    fp4_flops: float | None = None


@dataclass(frozen=True)
class Problem:
    """The resolved supernode problem (SI units; see the module docstring)."""

    name: str
    file: str
    inventory: DecodeInventory
    hw: Hardware
    cards: int
    sizes: tuple[int, ...]
    allow_cross_server: bool
    context_tokens: int
    reserve_bytes: float
    slo_s: float
    overlap_efficiency: float
    fixed_s: float
    single_user_a2a: int
    table_tiers: dict[str, tuple[str, ...]]
    kv_tiers: tuple[str, ...]
    target_sessions: int | None
    objective: "SupernodeObjective"  # resolved by load (objectives/supernode/)
    fabric: FabricSpec | None = None  # candidate scale-up fabrics (None: the system's NVLink domain)
    expert_load: ExpertLoad | None = None  # routing skew of the All-to-All (None: uniform)
    timing: dict = field(default_factory=lambda: {"source": "chapter", "why": ""})  # performance.source resolved


def pool_bandwidth(path_bandwidth: float, in_flight: int, transaction_bytes: float, round_trip_s: float) -> float:
    """Usable bandwidth of a remote memory pool, bytes/s (reference chapter, eq 6-12).

    ``min(B_path, u x q / L)`` with u transactions in flight of q bytes and round trip L
    (Little's law). Example: 128 x 256 B / 7.52 us = 4.36 GB/s.
    """
    return min(path_bandwidth, in_flight * transaction_bytes / round_trip_s)


def pool_in_flight_needed(bandwidth: float, transaction_bytes: float, round_trip_s: float) -> int:
    """Transactions in flight needed to reach ``bandwidth`` bytes/s (eq 6-12 solved for u)."""
    return int(math.ceil(bandwidth * round_trip_s / transaction_bytes - 1e-9))


def load_systems(path: Path = SYSTEMS_FILE) -> dict[str, dict[str, Any]]:
    """``{name: fields}`` from the systems file.

    Raises:
        InputError: the file is missing or malformed.
    """
    data = read_yaml(path)
    systems = data.get("systems")
    if not isinstance(systems, dict) or not systems:
        raise InputError(path, "systems", "missing or not a mapping")
    return systems


def _system(s: SupernodeIn, path: Path) -> tuple[SystemIn, str]:
    if isinstance(s.system, SystemIn):
        return s.system, "inline"
    systems = load_systems()
    if s.system not in systems:
        raise InputError(path, "supernode.system",
                         f"unknown system '{s.system}' (known: {', '.join(sorted(systems))} in {SYSTEMS_FILE.name})")
    try:
        return SystemIn.model_validate(systems[s.system]), s.system
    except ValidationError as err:
        raise validation_error_to_input_error(err, SYSTEMS_FILE, f"systems.{s.system}") from None


def resolve_hardware(sys_in: SystemIn, name: str, path: Path) -> Hardware:
    """Convert a system's figures to SI units (bytes, seconds, bytes/s, FLOP/s)."""
    if isinstance(sys_in.card, str):
        c = lookup("gpus", sys_in.card, path, "supernode.system.card")
        card = CardIn(name=c["name"], memory_gb=float(c["memory_gb"]),
                      memory_bandwidth_gb_s=float(c["memory_bandwidth_gb_s"]), bf16_tflops=float(c["bf16_tflops"]),
                      **{k: float(c[k]) for k in ("fp8_tflops", "fp4_tflops") if c.get(k) is not None})
    else:
        card = sys_in.card
    if sys_in.max_scale_up_cards < sys_in.server_cards:
        raise InputError(path, "supernode.system.max_scale_up_cards",
                         f"{sys_in.max_scale_up_cards} is smaller than server_cards ({sys_in.server_cards})")
    tiers: dict[str, Tier] = {}
    t = sys_in.tiers
    if t.host is not None:
        tiers["host"] = Tier("host", "server", t.host.capacity_gb_per_server * GB, t.host.round_trip_us * 1e-6,
                             t.host.bandwidth_gb_s * GB, reads_per_s=t.host.random_reads_per_s)
    if t.pool is not None:
        p = t.pool
        bw = pool_bandwidth(p.path_bandwidth_gb_s * GB, p.in_flight, p.transaction_bytes, p.round_trip_us * 1e-6)
        tiers["pool"] = Tier("pool", "system", p.capacity_gb * GB, p.round_trip_us * 1e-6, bw,
                             transaction_bytes=p.transaction_bytes,
                             detail={"in_flight": p.in_flight, "path_bandwidth_gb_s": p.path_bandwidth_gb_s,
                                     "in_flight_for_path": pool_in_flight_needed(p.path_bandwidth_gb_s * GB,
                                                                                 p.transaction_bytes,
                                                                                 p.round_trip_us * 1e-6)})
    if t.rom is not None:
        r = t.rom
        tiers["rom"] = Tier("rom", "card", r.capacity_gb_per_card * GB, r.hops * r.latency_per_hop_us * 1e-6,
                            r.bandwidth_gb_s * GB, detail={"hops": r.hops, "latency_per_hop_us": r.latency_per_hop_us})
    if t.sram is not None:
        tiers["sram"] = Tier("sram", "card", t.sram.capacity_mb_per_card * 1e6, t.sram.latency_us * 1e-6,
                             t.sram.bandwidth_gb_s * GB)
    return Hardware(
        name=name, card=card.name, memory_bytes=card.memory_gb * GB,
        hbm_bandwidth=card.memory_bandwidth_gb_s * GB, flops=card.bf16_tflops * 1e12,
        server_cards=sys_in.server_cards, max_scale_up_cards=sys_in.max_scale_up_cards,
        nvlink_bandwidth=sys_in.scale_up.bandwidth_gb_s * GB, nvlink_latency_s=sys_in.scale_up.latency_us * 1e-6,
        nic_bandwidth=sys_in.scale_out.bandwidth_gb_s * GB, nic_latency_s=sys_in.scale_out.latency_us * 1e-6,
        tiers=tiers, sources=dict(sys_in.source or {}),
        fp8_flops=None if card.fp8_tflops is None else card.fp8_tflops * 1e12,
        fp4_flops=None if card.fp4_tflops is None else card.fp4_tflops * 1e12)


def _inventory(m: ModelIn, path: Path) -> DecodeInventory:
    if (m.inventory is None) == (m.config is None):
        raise InputError(path, "model", "give exactly one of model.inventory (an inventory YAML) or model.config")
    if m.inventory is not None:
        from optimizer.model.inventory_file import read_inventory

        if m.weight_dtype is not None or m.kv_dtype is not None:
            raise InputError(path, "model.weight_dtype", "dtypes apply to model.config only (an inventory has bytes)")
        return read_inventory(existing_file(path, "model.inventory", Path(path).parent / m.inventory))
    from optimizer.model.decode import decode_inventory

    cfg = Path(path).parent / m.config
    existing_file(path, "model.config", cfg)
    try:
        return decode_inventory(cfg, m.weight_dtype or "bf16", m.kv_dtype)
    except InputError as exc:
        if exc.file == "<input>":  # a dtype error: name the instance's field
            raise InputError(path, f"model.{exc.field}", exc.problem) from None
        raise


def parse(raw: dict[str, Any], path: str | Path) -> InstanceIn:
    """Validate the raw instance mapping.

    Raises:
        InputError: unknown key, wrong type or out-of-range value (file, dotted field, problem).
    """
    return validate(InstanceIn, raw, path)


def resolve(inst: InstanceIn, path: str | Path, objective: "SupernodeObjective") -> Problem:
    """Read the model, fill hardware figures, check cross-field rules; build the :class:`Problem`.

    Raises:
        InputError: unknown system or card, a size that does not divide the cards or exceeds
            the scale-up domain, an unknown or undeclared tier, a table larger than every tier
            it may use, a context longer than the model accepts, the cards objective without
            ``target_sessions``, an unreadable ``expert_load`` trace.
    """
    path = Path(path)
    s = inst.supernode
    sys_in, sys_name = _system(s, path)
    hw = resolve_hardware(sys_in, sys_name, path)
    card_gpu = sys_in.card if isinstance(sys_in.card, str) else None
    hw, shares, timing = _timed_hardware(inst.performance, hw, card_gpu, path)
    timing["error_band"] = _band(card_gpu, inst.performance.engine or "vllm", timing["source"])
    inv = _inventory(inst.model, path)
    if s.cards > MAX_SERVERS * hw.server_cards:
        raise InputError(path, "supernode.cards", f"{s.cards} cards is more than {MAX_SERVERS} servers of "
                                                  f"{hw.server_cards} cards (the server limit of deployment and serving too)")
    sizes = tuple(sorted(set(s.sizes)))
    if len(sizes) != len(s.sizes):
        raise InputError(path, "supernode.sizes", "a size is listed twice")
    for i, S in enumerate(s.sizes):
        where = f"supernode.sizes[{i}]"
        if s.cards % S:
            raise InputError(path, where, f"size {S} does not divide the {s.cards} cards")
        if S > hw.max_scale_up_cards and s.fabric is None:
            if not s.allow_cross_server:
                raise InputError(path, where, f"size {S} exceeds the largest scale-up domain "
                                              f"({hw.max_scale_up_cards} cards): set allow_cross_server: true")
        if S > hw.max_scale_up_cards and s.fabric is None and S % hw.server_cards:
            raise InputError(path, where, f"size {S} spanning servers must be a multiple of {hw.server_cards} cards")
    if inv.max_context is not None and s.context_tokens > inv.max_context:
        raise InputError(path, "supernode.context_tokens",
                         f"{s.context_tokens} exceeds the model's {inv.max_context} tokens")
    declared = ("hbm",) + tuple(hw.tiers)
    names = [t.name for t in inv.tables]
    if isinstance(s.table_tiers, list):
        per_table = {n: tuple(s.table_tiers) for n in names}
        where_of = {n: "supernode.table_tiers" for n in names}
    else:
        for n in s.table_tiers:
            if n not in names:
                raise InputError(path, f"supernode.table_tiers.{n}", f"the model has no table '{n}' "
                                                                     f"(tables: {', '.join(names) or 'none'})")
        missing = [n for n in names if n not in s.table_tiers]
        if missing:
            raise InputError(path, "supernode.table_tiers", f"no tiers for table '{missing[0]}'")
        per_table = {n: tuple(v) for n, v in s.table_tiers.items()}
        where_of = {n: f"supernode.table_tiers.{n}" for n in names}
    checks = dict(per_table)
    if isinstance(s.table_tiers, list):  # checked even when the model has no table to use it
        checks[None] = tuple(s.table_tiers)
        where_of[None] = "supernode.table_tiers"
    for n, tiers in checks.items():
        if not tiers:
            raise InputError(path, where_of[n], "no tier given")
        for t in tiers:
            if t not in TIER_NAMES:
                raise InputError(path, where_of[n], f"unknown tier '{t}' (use: {', '.join(TIER_NAMES)})")
            if t not in declared:
                raise InputError(path, where_of[n], f"tier '{t}' is not declared by system '{hw.name}'")
    for t in s.kv_tiers:
        if t not in KV_TIER_NAMES:
            raise InputError(path, "supernode.kv_tiers", f"KV can live in {', '.join(KV_TIER_NAMES)}, not '{t}'")
        if t not in declared:
            raise InputError(path, "supernode.kv_tiers", f"tier '{t}' is not declared by system '{hw.name}'")
    if not s.kv_tiers:
        raise InputError(path, "supernode.kv_tiers", "no tier given")
    # a table larger than every tier it may use, at the largest size: bad input, not a search
    extra_share = inv.table_extra_bytes / inv.table_bytes if inv.table_bytes else 0.0
    for tab in inv.tables:
        need = tab.bytes * (1 + extra_share)
        caps = {}
        for t in per_table[tab.name]:
            if t == "hbm":
                caps[t] = hw.memory_bytes * max(sizes)
            else:
                tier = hw.tiers[t]
                mult = {"card": max(sizes), "server": max(max(sizes) // hw.server_cards, 1), "system": 1}[tier.scope]
                caps[t] = tier.capacity_bytes * mult
        if all(need > c for c in caps.values()):
            listed = ", ".join(f"{t} {c / GB:,.1f} GB" for t, c in caps.items())
            raise InputError(path, where_of[tab.name], f"table '{tab.name}' ({need / GB:,.1f} GB) is larger than every "
                                                       f"tier it may use at the largest size ({listed})")
    if objective.needs_target and s.target_sessions is None:
        raise InputError(path, "supernode.target_sessions", f"the {objective.name} objective needs a target_sessions")
    fabric = None if s.fabric is None else resolve_fabric(s.fabric, path, sizes)
    skew = None if s.expert_load is None else resolve_expert_load(s.expert_load, path, inv.routed_experts)
    if objective.needs_fabric and fabric is None:
        raise InputError(path, "supernode.fabric", f"the {objective.name} objective needs a fabric section")
    if fabric is not None:
        from optimizer.supernode.fabric import applies

        for i, S in enumerate(s.sizes):
            if not any(applies(c, S) for c in fabric.candidates):
                raise InputError(path, f"supernode.sizes[{i}]", f"no fabric candidate joins {S} cards "
                                                                f"(a torus's dims must multiply to the size)")
    return Problem(
        name=inst.name or path.stem, file=str(path), inventory=inv, hw=hw, cards=s.cards, sizes=sizes,
        allow_cross_server=s.allow_cross_server, context_tokens=s.context_tokens,
        reserve_bytes=s.reserve_gib_per_card * GIB, slo_s=s.slo_ms_per_token * 1e-3,
        overlap_efficiency=s.overlap_efficiency, fixed_s=s.fixed_us_per_token * 1e-6,
        single_user_a2a=s.single_user_all_to_all_per_moe_layer, table_tiers=per_table, kv_tiers=tuple(dict.fromkeys(s.kv_tiers)), target_sessions=s.target_sessions,
        objective=objective, fabric=_derated_fabric(fabric, shares), expert_load=skew, timing=timing)


def _timed_hardware(pin: PerformanceIn, hw: Hardware, gpu: Optional[str], path: Path):
    """The system as ``performance.source`` times it: ``chapter`` at the datasheet peaks (eq. 6-15
    as the reference chapter), ``analytic`` and ``auto`` on the card's achieved peaks fitted to the
    measured kernel database (:func:`optimizer.model.efficiency.fitted_efficiency`: HBM bandwidth,
    tensor-core peaks and the scale-up/scale-out link bandwidths times the card's shares; latencies
    and tiers unchanged). The supernode problem has no measured source yet: ``auto`` is
    ``analytic`` (said in ``why``) and ``measured`` is refused. Returns ``(hardware, shares or
    None, {source, why})``.

    Raises:
        InputError: ``measured``, or a field of the measured source (engine_version,
            memory_fraction, gemm_quant, calibration)."""
    from dataclasses import replace

    if pin.source == "measured":
        raise InputError(path, "performance.source", "the supernode problem has no measured step times yet "
                                                     "(chapter, analytic or auto)")
    for name in ("engine_version", "memory_fraction", "gemm_quant", "calibration"):
        if getattr(pin, name) is not None:
            raise InputError(path, f"performance.{name}", "applies to the measured source, which the supernode "
                                                          "problem does not have yet")
    if pin.source == "chapter":
        return hw, None, {"source": "chapter", "why": "the reference chapter's roofline (eqs. 6-14, 6-15) at the "
                                                      "card's datasheet peaks"}
    from optimizer.model.efficiency import fitted_efficiency

    lead = "analytic roofline (eq. 6-15)" + (" (auto: the supernode problem has no measured step times yet)"
                                             if pin.source == "auto" else "")
    f = fitted_efficiency(gpu, pin.engine or "vllm") if gpu is not None else None
    if f is None:
        return hw, None, {"source": "analytic", "why": f"{lead} at the card's datasheet peaks (no fitted "
                                                       f"efficiency for card {hw.card})"}
    scale = lambda v, k: None if v is None else v * k  # noqa: E731
    out = replace(hw, hbm_bandwidth=hw.hbm_bandwidth * f.memory, flops=hw.flops * f.compute,
                  fp8_flops=scale(hw.fp8_flops, f.compute), fp4_flops=scale(hw.fp4_flops, f.compute),
                  nvlink_bandwidth=hw.nvlink_bandwidth * f.network, nic_bandwidth=hw.nic_bandwidth * f.network)
    return out, f, {"source": "analytic", "why": f"{lead} at achieved peaks (compute {f.compute:.2f}, memory "
                                                 f"{f.memory:.2f}, network {f.network:.2f} of the datasheet's; "
                                                 f"{f.why})"}


def _band(gpu: Optional[str], engine: str, source: str) -> Optional[dict]:
    """The source's measured TPOT error over serving runs of the card's GPU and ``engine``
    (``instances/hardware/fidelity.yaml``; a decode step's tokens/s per card inherits it), or None
    (an inline card, or a GPU without measured runs)."""
    from optimizer.model.bands import band
    from optimizer.model.measured import systems

    b = band(systems().get(gpu or ""), engine, source)
    return None if b is None else {"tokens_per_s_error": b["tpot_median_abs_error"], "rows": b.get("rows"),
                                   "engine": engine, "from": b.get("from")}


def _derated_fabric(fabric: Optional[FabricSpec], shares) -> Optional[FabricSpec]:
    """Candidate fabrics' port and switch bandwidths times the fitted network share."""
    if fabric is None or shares is None:
        return fabric
    from dataclasses import replace

    return replace(fabric, switch_bandwidth=fabric.switch_bandwidth * shares.network,
                   port_bandwidth=fabric.port_bandwidth * shares.network)


def load(raw: dict[str, Any], path: str | Path, objective: str | None) -> Problem:
    """Parse and resolve an instance; the problem's ``objective`` is the named objective object
    (default: the registry's default) from ``objectives/supernode/``.

    Raises:
        InputError: bad input, including an unknown objective name.
    """
    from objectives.base import default_of
    from objectives.supernode import registry

    objectives = registry()
    name = objective or default_of(objectives)
    if name not in objectives:
        raise InputError(path, "--objective", f"unknown objective '{name}' for supernode (use one of: {', '.join(objectives)})")
    return resolve(parse(raw, path), path, objectives[name])
