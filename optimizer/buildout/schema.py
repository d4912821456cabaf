"""The ``buildout:`` section of an instance: strict input schema and the resolved problem.

Input units are in the field names (``power_budget_kw``, ``port_bandwidth_gb_s``). They are
converted exactly once, in :func:`resolve`, to the integer units the CP-SAT model needs:

* power: whole watts (resolution 1 W). Server, fixed and second-tier power are rounded *up*
  to a whole watt and the budget and per-rack limits *down*, so a plan that fits the integer
  model fits the kW figures.
* cost: hundredths of the cost unit (resolution 0.01).
* rack feeds: the usable power of one rack's feeds, ``feed_kw x max_utilization x
  (feeds_per_rack / 2 if redundant_feeds else feeds_per_rack)``, rounded *down* to a watt.
* oversubscription: an exact fraction (``Fraction(str(x))``), used only in integer
  arithmetic when the leaf port splits are enumerated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

from pydantic import Field, field_validator

from optimizer.errors import InputError

if TYPE_CHECKING:
    from objectives.buildout import BuildoutObjective
from optimizer.schema_base import PerformanceIn, StrictModel, read_yaml, validate

PosFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
PosInt = Annotated[int, Field(strict=True, ge=1)]
Utilization = Annotated[float, Field(strict=True, gt=0, le=1, allow_inf_nan=False)]
NonNegInt = Annotated[int, Field(strict=True, ge=0)]
# power figures above 10 GW (beyond any planned campus) are refused: CP-SAT's integer watts
# overflow its bounds near 1e15 W, and a budget of that size is a typo
MAX_KW = 1e7
Kw = Annotated[float, Field(strict=True, gt=0, le=MAX_KW, allow_inf_nan=False)]
NonNegKw = Annotated[float, Field(strict=True, ge=0, le=MAX_KW, allow_inf_nan=False)]

SERVERS_FILE = Path(__file__).resolve().parents[2] / "instances" / "hardware" / "buildout_servers.yaml"


class ServerTypeIn(StrictModel):
    """One server type: a name from ``instances/hardware/buildout_servers.yaml`` or inline figures.

    Inline fields override the data file's figure for that name; a name that is not in the
    data file needs ``gpus``, ``power_kw`` and ``rack_units`` (``cost`` only for ``--objective cost``).
    """

    name: Annotated[str, Field(strict=True, min_length=1)]
    max_count: Optional[NonNegInt] = None
    gpus: Optional[PosInt] = None
    power_kw: Optional[Kw] = None
    rack_units: Optional[PosInt] = None
    cost: Optional[NonNegFloat] = None


class RacksIn(StrictModel):
    """Rack limits. A rack is either air or liquid cooled; ``null`` means that cooling is not available.

    Optional power feeds (the electrical limit, on top of the cooling limit): each rack has
    ``feeds_per_rack`` feeds (circuits) of ``feed_kw`` each, loaded to at most
    ``max_utilization`` of their rating (0.8: the NEC continuous-load rule). With
    ``redundant_feeds`` the feeds are A+B pairs and the load must fit one side, i.e. half the
    feeds (``feeds_per_rack`` then defaults to 2 and must be even). Example: a 208 V, 60 A
    three-phase feed is 208 x 60 x sqrt(3) = 21.6 kW; x 0.8 = 17.28 kW usable with A+B.
    """

    air_cooled_kw: Optional[Kw]
    liquid_cooled_kw: Optional[Kw] = None
    rack_units: PosInt
    feed_kw: Optional[Kw] = None
    max_utilization: Optional[Utilization] = None
    redundant_feeds: Optional[Annotated[bool, Field(strict=True)]] = None
    feeds_per_rack: Optional[PosInt] = None


class FabricIn(StrictModel):
    """A leaf/spine switch fabric for the GPUs' links (scale-up or scale-out)."""

    switch_radix: Annotated[int, Field(strict=True, ge=2)]
    port_bandwidth_gb_s: PosFloat
    gpu_links: PosInt
    max_oversubscription: PosFloat
    second_tier_power_kw: NonNegKw
    one_tier_max_gpus: PosInt
    switch_power_kw: NonNegKw = 0.0
    switch_rack_units: NonNegInt = 0


class ScaleUpDomainsIn(StrictModel):
    """Scale-up domains of ``cards`` GPUs, each with the fabric the supernode problem chose for it
    (its ``fabric_bill`` per domain: ``optimize instances/supernode_fabric_512.yaml --objective cost``):
    switch chips, port links, fabric power and cost per domain."""

    cards: PosInt
    switch_chips: NonNegInt
    port_links: NonNegInt
    power_kw: NonNegKw
    cost: Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)] = 0.0
    source: Optional[Annotated[str, Field(strict=True, min_length=1)]] = None


class WorkloadModelIn(StrictModel):
    config: Annotated[str, Field(strict=True, min_length=1)]
    hf_id: Optional[Annotated[str, Field(strict=True, min_length=1)]] = None
    weight_dtype: Optional[str] = None
    kv_dtype: Optional[str] = None


class WorkloadTrafficIn(StrictModel):
    isl: PosInt
    osl: PosInt


class WorkloadSloIn(StrictModel):
    ttft_ms: Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
    tpot_ms: Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]


class WorkloadIn(StrictModel):
    """``buildout.workload``: what the hall serves, for ``--objective tokens``
    (:mod:`optimizer.buildout.workload`)."""

    model: WorkloadModelIn
    traffic: WorkloadTrafficIn
    slo: WorkloadSloIn
    performance: PerformanceIn = PerformanceIn()


class BuildoutIn(StrictModel):
    power_budget_kw: Kw
    fixed_power_kw: NonNegKw = 0.0
    server_types: list[ServerTypeIn] = Field(min_length=1)
    install_unit_servers: PosInt = 1
    target_gpus: Optional[PosInt] = None
    racks: RacksIn
    fabric: Optional[FabricIn] = None
    scale_up_domains: Optional[ScaleUpDomainsIn] = None
    workload: Optional[WorkloadIn] = None

    @field_validator("server_types")
    @classmethod
    def _unique_names(cls, v: list[ServerTypeIn]) -> list[ServerTypeIn]:
        seen: set[str] = set()
        for st in v:
            if st.name == "switches":
                raise ValueError("'switches' is reserved for the switch chips (a rack's content); rename the server type")
            if st.name in seen:
                raise ValueError(f"server type '{st.name}' is listed twice")
            seen.add(st.name)
        return v


class InstanceIn(StrictModel):
    name: Optional[Annotated[str, Field(strict=True)]] = None
    buildout: BuildoutIn


# ----------------------------------------------------------------------------- resolved


@dataclass(frozen=True)
class ServerType:
    """A resolved server type. ``power_w`` is ``power_kw`` rounded up to a whole watt."""

    name: str
    gpus: int
    power_kw: float
    rack_units: int
    cost: float | None
    max_count: int | None
    source: str
    delivered: Any = None  # buildout.workload: optimizer.buildout.workload.Delivered (None: no workload)

    @property
    def tokens_per_s_int(self) -> int:
        """Delivered tokens/s of one server, whole tokens/s (0 without a workload)."""
        return 0 if self.delivered is None else int(round(self.delivered.per_server))

    @property
    def power_w(self) -> int:
        return kw_to_w_up(self.power_kw)

    @property
    def cost_c(self) -> int | None:
        """Cost in hundredths of the cost unit (None when unknown)."""
        return None if self.cost is None else int(round(self.cost * 100))


@dataclass(frozen=True)
class Fabric:
    switch_radix: int
    port_bandwidth_gb_s: float
    gpu_links: int
    max_oversubscription: Fraction
    second_tier_power_kw: float
    one_tier_max_gpus: int
    switch_power_kw: float = 0.0
    switch_rack_units: int = 0

    @property
    def second_tier_power_w(self) -> int:
        return kw_to_w_up(self.second_tier_power_kw)

    @property
    def switch_power_w(self) -> int:
        """Power of one switch chip, whole watts rounded up."""
        return kw_to_w_up(self.switch_power_kw)

    @property
    def switches_in_racks(self) -> bool:
        """True when switch chips take rack space or rack power (they are then placed in racks)."""
        return self.switch_power_kw > 0 or self.switch_rack_units > 0


@dataclass(frozen=True)
class ScaleUpDomains:
    """GPUs grouped in scale-up domains of ``cards``, each domain's fabric with ``switch_chips``
    switch chips, ``port_links`` links, ``power_kw`` and ``cost`` (the cost unit)."""

    cards: int
    switch_chips: int
    port_links: int
    power_kw: float
    cost: float = 0.0
    source: str = ""

    @property
    def power_w(self) -> int:
        """One domain's fabric power, whole watts rounded up."""
        return kw_to_w_up(self.power_kw)

    @property
    def cost_c(self) -> int:
        return int(round(self.cost * 100))


@dataclass(frozen=True)
class Problem:
    """The resolved build-out problem (see the module docstring for units)."""

    name: str
    file: str
    power_budget_kw: float
    fixed_power_kw: float
    types: tuple[ServerType, ...]
    install_unit_servers: int
    target_gpus: int | None
    air_cooled_kw: float | None
    liquid_cooled_kw: float | None
    rack_units: int
    fabric: Fabric | None
    cost_unit: str
    feed_kw: float | None = None
    max_utilization: float | None = None
    feeds_per_rack: int = 1
    redundant_feeds: bool = False
    objective: Optional["BuildoutObjective"] = None  # the objective resolved by load (objectives/buildout/)
    domains: ScaleUpDomains | None = None  # scale-up domains and their fabric (None: not counted)

    @property
    def feed_usable_kw(self) -> float | None:
        """Usable power of one rack's feeds, kW (None without feeds):
        ``feed_kw x max_utilization x (feeds_per_rack / 2 if redundant_feeds else feeds_per_rack)``."""
        if self.feed_kw is None:
            return None
        feeds = self.feeds_per_rack // 2 if self.redundant_feeds else self.feeds_per_rack
        return self.feed_kw * self.max_utilization * feeds

    @property
    def feed_limit_w(self) -> int | None:
        """:attr:`feed_usable_kw` in whole watts, rounded down."""
        kw = self.feed_usable_kw
        return None if kw is None else kw_to_w_down(kw)

    def cooling_only_w(self) -> dict[str, int]:
        """Per-rack cooling limit by cooling kind, watts (without the feed limit)."""
        out = {}
        if self.air_cooled_kw is not None:
            out["air"] = kw_to_w_down(self.air_cooled_kw)
        if self.liquid_cooled_kw is not None:
            out["liquid"] = kw_to_w_down(self.liquid_cooled_kw)
        return out

    @property
    def budget_w(self) -> int:
        return kw_to_w_down(self.power_budget_kw)

    @property
    def fixed_w(self) -> int:
        return kw_to_w_up(self.fixed_power_kw)

    def cooling_limits_w(self) -> dict[str, int]:
        """Per-rack power limit by cooling kind, watts, for the kinds that are available: the
        cooling limit, or the usable feed power when that is lower."""
        feed = self.feed_limit_w
        return {c: (w if feed is None else min(w, feed)) for c, w in self.cooling_only_w().items()}

    def type(self, name: str) -> ServerType:
        for t in self.types:
            if t.name == name:
                return t
        raise KeyError(name)


def kw_to_w_up(kw: float) -> int:
    """kW -> whole watts, rounded up (tolerating float noise: 10.2 kW -> 10200 W)."""
    return int(math.ceil(kw * 1000 - 1e-6))


def kw_to_w_down(kw: float) -> int:
    """kW -> whole watts, rounded down (tolerating float noise)."""
    return int(math.floor(kw * 1000 + 1e-6))


def load_server_data(path: Path = SERVERS_FILE) -> tuple[dict[str, dict[str, Any]], str]:
    """Read ``buildout_servers.yaml``: ``({name: {gpus, power_kw, rack_units, cost, source}}, cost_unit)``.

    Raises:
        InputError: the file is missing or malformed.
    """
    data = read_yaml(path)
    servers = data.get("servers")
    if not isinstance(servers, dict):
        raise InputError(path, "servers", "missing or not a mapping")
    for name, entry in servers.items():
        if not isinstance(entry, dict):
            raise InputError(path, f"servers.{name}", "expected a mapping")
        for key in ("gpus", "power_kw", "rack_units", "cost", "source"):
            if key not in entry:
                raise InputError(path, f"servers.{name}.{key}", "required field is missing")
    return servers, str(data.get("cost_unit", "cost unit"))


def _delivered(workload: WorkloadIn, server: str, gpus: int, path: Path, where: str):
    """:func:`optimizer.buildout.workload.tokens_per_server` for a catalog server; one line naming
    ``where`` for a server type the catalog does not hold (its GPUs cannot be timed)."""
    from optimizer.buildout.workload import tokens_per_server
    from optimizer.catalog import load_catalog

    entry = load_catalog()["servers"].get(server)
    if entry is None or not entry.get("gpu_models"):
        raise InputError(path, where, f"'{server}' is not a server of instances/hardware/catalog.yaml: its GPUs cannot "
                                      f"be timed for buildout.workload")
    return tokens_per_server(workload, server, entry["gpu_models"][0], gpus, path, where)


def parse(raw: dict[str, Any], path: str | Path) -> InstanceIn:
    """Validate the raw instance mapping.

    Raises:
        InputError: unknown key, wrong type or out-of-range value (file, dotted field, problem).
    """
    return validate(InstanceIn, raw, path)


def resolve(inst: InstanceIn, path: str | Path, objective: "BuildoutObjective",
            servers_file: Path = SERVERS_FILE) -> Problem:
    """Fill catalog figures, check cross-field rules and build the :class:`Problem`.

    Raises:
        InputError: unknown server name, missing inline figure, no cooling available, a
            missing ``target_gpus`` for the cost/racks objectives, a missing cost for the
            cost objective, feed fields without ``feed_kw``, ``feed_kw`` without
            ``max_utilization``, or an odd ``feeds_per_rack`` with ``redundant_feeds``.
    """
    needs_cost, needs_target = objective.needs_cost, objective.needs_target
    b = inst.buildout
    data, cost_unit = load_server_data(servers_file)
    types = []
    costs_from_file = True
    for i, st in enumerate(b.server_types):
        where = f"buildout.server_types[{i}]"
        base = data.get(st.name, {})
        fig = {}
        for key in ("gpus", "power_kw", "rack_units", "cost"):
            val = getattr(st, key)
            fig[key] = val if val is not None else base.get(key)
        if not base:
            for key in ("gpus", "power_kw", "rack_units"):
                if fig[key] is None:
                    known = ", ".join(sorted(data))
                    inline = any(getattr(st, k) is not None for k in ("gpus", "power_kw", "rack_units"))
                    raise InputError(path, f"{where}.{key}" if inline else f"{where}.name",
                                     f"'{st.name}' is not in {servers_file.name} (known: {known}); "
                                     f"give gpus, power_kw and rack_units inline")
        if needs_cost and fig["cost"] is None:
            raise InputError(path, f"{where}.cost", f"the {objective.name} objective needs a cost for every server type")
        if st.cost is not None or not base:
            costs_from_file = False
        overridden = [k for k in ("gpus", "power_kw", "rack_units", "cost") if getattr(st, k) is not None]
        source = "inline" if not base else str(base.get("source", "")).strip()
        if base and overridden:
            source = f"{source} [overridden inline: {', '.join(overridden)}]"
        delivered = None
        if b.workload is not None:
            delivered = _delivered(b.workload, st.name, int(fig["gpus"]), Path(path), f"{where}.name")
        types.append(ServerType(
            name=st.name, gpus=int(fig["gpus"]), power_kw=float(fig["power_kw"]),
            rack_units=int(fig["rack_units"]), cost=None if fig["cost"] is None else float(fig["cost"]),
            max_count=st.max_count, source=source, delivered=delivered))
    if objective.needs_workload and b.workload is None:
        raise InputError(path, "buildout.workload", f"the {objective.name} objective needs a workload (model, traffic: "
                                                    f"isl/osl, slo: ttft_ms/tpot_ms): what each server delivers")
    if b.racks.air_cooled_kw is None and b.racks.liquid_cooled_kw is None:
        raise InputError(path, "buildout.racks", "no cooling available: give air_cooled_kw or liquid_cooled_kw")
    if needs_target and b.target_gpus is None:
        raise InputError(path, "buildout.target_gpus", f"the {objective.name} objective needs a target_gpus")
    r = b.racks
    feed_extras = [k for k in ("max_utilization", "redundant_feeds", "feeds_per_rack") if getattr(r, k) is not None]
    if r.feed_kw is None and feed_extras:
        raise InputError(path, f"buildout.racks.{feed_extras[0]}", "needs buildout.racks.feed_kw (the rating of one rack feed)")
    redundant = bool(r.redundant_feeds)
    feeds = r.feeds_per_rack if r.feeds_per_rack is not None else (2 if redundant else 1)
    if r.feed_kw is not None:
        if r.max_utilization is None:
            raise InputError(path, "buildout.racks.max_utilization",
                             "required with feed_kw: the fraction of a feed's rating the load may use "
                             "(e.g. 0.8 for continuous load), within (0, 1]")
        if redundant and feeds % 2:
            raise InputError(path, "buildout.racks.feeds_per_rack",
                             f"redundant_feeds pairs A and B feeds, so feeds_per_rack must be even (got {feeds})")
    fab = None
    if b.fabric is not None:
        f = b.fabric
        fab = Fabric(f.switch_radix, f.port_bandwidth_gb_s, f.gpu_links,
                     Fraction(str(f.max_oversubscription)).limit_denominator(10**6),
                     f.second_tier_power_kw, f.one_tier_max_gpus, f.switch_power_kw, f.switch_rack_units)
    return Problem(
        name=inst.name or Path(path).stem, file=str(path),
        power_budget_kw=b.power_budget_kw, fixed_power_kw=b.fixed_power_kw, types=tuple(types),
        install_unit_servers=b.install_unit_servers, target_gpus=b.target_gpus,
        air_cooled_kw=b.racks.air_cooled_kw, liquid_cooled_kw=b.racks.liquid_cooled_kw,
        rack_units=b.racks.rack_units, fabric=fab,
        cost_unit=cost_unit if costs_from_file else "cost unit",
        feed_kw=r.feed_kw, max_utilization=r.max_utilization, feeds_per_rack=feeds, redundant_feeds=redundant,
        objective=objective,
        domains=None if b.scale_up_domains is None else ScaleUpDomains(
            **{k: v for k, v in b.scale_up_domains.model_dump().items() if k != "source"},
            source=b.scale_up_domains.source or ""))


def load(raw: dict[str, Any], path: str | Path, objective: str | None) -> Problem:
    """Parse and resolve an instance; the problem's ``objective`` is the named objective object
    (default: the registry's default) from ``objectives/buildout/``.

    Raises:
        InputError: bad input, including an unknown objective name.
    """
    from objectives.base import default_of
    from objectives.buildout import registry

    objectives = registry()
    name = objective or default_of(objectives)
    if name not in objectives:
        raise InputError(path, "--objective", f"unknown objective '{name}' for buildout (use one of: {', '.join(objectives)})")
    return resolve(parse(raw, path), path, objectives[name])
