"""The supernode's fabric as a decision (issue #26 item 3): candidate scale-up fabrics of a
domain of S cards, each with a connection organisation, timed and counted by the one fabric
model (:mod:`optimizer.model.fabric`, :mod:`optimizer.model.connections`).

The ``supernode.fabric`` section lists candidate topologies (a torus of given ``dims``, or a
switched fabric of one or two levels with a down/up port split) and connection organisations
(``pairwise`` reliable connections, ``endpoint+channel`` = UB). A candidate fabric is one
topology x one organisation; a torus applies to the size its ``dims`` multiply to, a switched
fabric to every size it can join.

Without ``candidates`` (the key absent or null) the topologies are generated
(:func:`generate_topologies`) for the problem's sizes: every torus of 1, 2 and 3 dimensions,
each at least 2, whose dims multiply to a size (dims in non-decreasing order: a torus is
symmetric under permuting its dimensions, so each shape once; :func:`torus_shapes`), the
one-level switched fabric, and two-level switched fabrics with every down/up split of the chip's
ports ``down + up = ports``, ``down >= up``, ``up`` in steps of ``split_step_ports`` (default 1:
every split), each for the sizes that need two leaves or more (``S > down``: one leaf is the
one-level fabric plus idle spines). Generated topologies are candidates like listed ones: the
same cuts (a torus of more ports than the card has, one level beyond the chip, more leaves
than a spine reaches) and the same figures below.

For each (candidate, size) :func:`figures` derives, once (cached; the timing once per topology
and size, shared by both organisations):

* **ports**: a torus takes ``2 x len(dims)`` card ports, each bundling
  ``floor(card_ports / (2 len(dims)))`` of the card's ports (link bandwidth = bundle x
  ``port_bandwidth_gb_s``); a switched fabric takes ``ports_per_card`` (default ``card_ports``)
  ports, one per plane, at the switch chip's port bandwidth. More ports than the card has, or a
  topology the switch chip cannot build (one level beyond its port count, ``down + up`` over
  it), is a ``fabric_ports`` violation;
* **links and switch chips**: ``port_links`` (one per card port used, and per leaf uplink) and
  ``switch_chips`` from the topology (a torus link of b ports counts b port links);
* **All-to-All**: one uniform All-to-All (MoE dispatch; the combine is its transpose and takes
  as long) of ``B`` bytes leaving each card is ``alpha + max chips x hop latency + B x k``,
  where ``alpha`` is the system's scale-up round latency (once, as without a fabric) and ``k``
  the busiest directed link's seconds per byte out, from
  :func:`optimizer.model.fabric.alltoall_time` of the uniform traffic at 1 MB (the load is
  linear in B). With an expert-load skew (:mod:`optimizer.supernode.expert_load`) ``k`` is
  instead, per layer of the trace, the busiest link's seconds per byte of the skewed dispatch
  and of its combine (:func:`optimizer.model.fabric.moe_link_loads`), averaged over the two and
  over the layers, per byte the uniform exchange would send out (``B = D (S-1)/S`` for ``D``
  bytes of a card's tokens); the latency term stays the uniform one (every pair exchanges);
* **connection state** per NIC for ``H = S / server_cards`` hosts with ``A`` endpoints each:
  pairwise ``512 A^2 (H-1) + 32 A`` or UB ``52 A + 56 (H-1)`` bytes (section 6.5.5) against
  the NIC's on-chip cache; more is a ``connection_state`` violation;
* **cost and power** of one domain's fabric: ``port_links x link_cost_usd + switch_chips x
  switch_cost_usd`` (+ ``ub_cost_usd_per_host x H`` for UB) and
  ``port_links x link_power_w + switch_chips x switch_power_w``, W.

Units: SI inside (bytes, seconds, bytes/s, W, USD); input units in the field names.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import numpy as np
from pydantic import Field, model_validator

from optimizer.errors import InputError
from optimizer.model import connections as conn
from optimizer.model.fabric import (GB, Switched, Torus, alltoall_time, fabric_entry, moe_link_loads,
                                   uniform_alltoall)
from optimizer.schema_base import StrictModel

PosFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
PosInt = Annotated[int, Field(strict=True, ge=1)]
ORGANISATIONS = ("pairwise", "endpoint+channel")
PROBE_BYTES = 1e6  # bytes out per card at which the linear All-to-All coefficient is measured


class CandidateIn(StrictModel):
    """One candidate topology of ``supernode.fabric.candidates``."""

    kind: Literal["torus", "switched"]
    dims: Optional[list[Annotated[int, Field(strict=True, ge=2)]]] = None
    ports_per_card: Optional[PosInt] = None
    levels: Literal[1, 2] = 1
    down_ports: Optional[PosInt] = None
    up_ports: Optional[PosInt] = None

    @model_validator(mode="after")
    def _check(self):
        if self.kind == "torus":
            if not self.dims:
                raise ValueError("a torus needs dims")
            if self.ports_per_card is not None or self.down_ports or self.up_ports or self.levels != 1:
                raise ValueError("a torus takes dims only (2 ports per card per dimension, no switch chips)")
        else:
            if self.dims is not None:
                raise ValueError("dims are for a torus")
            if self.levels == 2 and (self.down_ports is None or self.up_ports is None):
                raise ValueError("two levels need down_ports and up_ports")
            if self.levels == 1 and (self.down_ports or self.up_ports):
                raise ValueError("down_ports / up_ports are for two levels")
        return self


class SwitchChipIn(StrictModel):
    """An inline switch chip (the fields of ``fabric.yaml``'s ``switch_chips`` entries)."""

    ports: Annotated[int, Field(strict=True, ge=2)]
    port_bandwidth_gb_s: PosFloat
    source: Optional[str] = None


class FabricSectionIn(StrictModel):
    """The ``supernode.fabric`` section (see the module docstring). ``candidates`` absent or
    null: generated (:func:`generate_topologies`); ``split_step_ports`` only then."""

    switch: Union[str, SwitchChipIn]
    card_ports: PosInt
    port_bandwidth_gb_s: PosFloat
    hop_latency: Optional[str] = None
    hop_latency_ns: Optional[NonNegFloat] = None
    nic: str
    endpoints_per_host: PosInt
    connections: list[Literal["pairwise", "endpoint+channel"]] = Field(min_length=1)
    link_cost_usd: NonNegFloat = 0.0
    link_power_w: NonNegFloat = 0.0
    switch_cost_usd: NonNegFloat = 0.0
    switch_power_w: NonNegFloat = 0.0
    ub_cost_usd_per_host: NonNegFloat = 0.0
    card_cost_usd: NonNegFloat = 0.0
    max_power_kw: Optional[PosFloat] = None
    max_switch_chips: Optional[Annotated[int, Field(strict=True, ge=0)]] = None
    candidates: Optional[list[CandidateIn]] = Field(default=None, min_length=1)
    split_step_ports: Optional[PosInt] = None
    source: Optional[dict[str, str]] = None

    @model_validator(mode="after")
    def _check(self):
        if (self.hop_latency is None) == (self.hop_latency_ns is None):
            raise ValueError("give exactly one of hop_latency (a fabric.yaml name) or hop_latency_ns")
        if len(set(self.connections)) != len(self.connections):
            raise ValueError("a connection organisation is listed twice")
        if self.candidates is not None and self.split_step_ports is not None:
            raise ValueError("split_step_ports applies to generated candidates only (omit candidates)")
        return self


@dataclass(frozen=True)
class Candidate:
    """A candidate fabric: a topology (the fields of :class:`CandidateIn`) x a connection
    ``organisation``; ``index`` is its position in :attr:`FabricSpec.candidates`."""

    index: int
    kind: str
    dims: tuple[int, ...] | None
    ports_per_card: int | None
    levels: int
    down_ports: int | None
    up_ports: int | None
    organisation: str
    generated: bool = False                # made by generate_topologies, not listed
    sizes: tuple[int, ...] | None = None   # the sizes it applies to (None: every size it joins)

    @property
    def spec(self) -> "Candidate":
        return self

    @property
    def topology(self) -> "Candidate":
        """The topology alone (organisation, index and origin dropped): the timing's cache key."""
        return Candidate(0, self.kind, self.dims, self.ports_per_card, self.levels, self.down_ports, self.up_ports,
                         "pairwise")

    def topology_label(self) -> str:
        s = self
        if s.kind == "torus":
            return "torus " + "x".join(map(str, s.dims))
        if s.levels == 1:
            return "switched 1 level" + (f" {s.ports_per_card} ports" if s.ports_per_card else "")
        return f"switched {s.down_ports}/{s.up_ports}" + (f" {s.ports_per_card} ports" if s.ports_per_card else "")

    @property
    def label(self) -> str:
        return f"{self.topology_label()} {'UB' if self.organisation == 'endpoint+channel' else 'pairwise'}"


@dataclass(frozen=True)
class FabricSpec:
    """The resolved ``supernode.fabric`` section (SI units)."""

    switch: str
    switch_ports: int
    switch_bandwidth: float
    switch_cost_usd: float
    switch_power_w: float
    card_ports: int
    port_bandwidth: float
    hop_latency_s: float
    nic: str
    cache_bytes: float
    endpoints_per_host: int
    link_cost_usd: float
    link_power_w: float
    ub_cost_usd_per_host: float
    card_cost_usd: float
    max_power_w: float | None
    max_switch_chips: int | None
    candidates: tuple[Candidate, ...]
    sources: tuple[tuple[str, str], ...]
    generated: bool = False              # candidates generated (``candidates`` absent)
    split_step_ports: int | None = None  # the two-level split step when generated

    @property
    def topologies(self) -> tuple[Candidate, ...]:
        """The distinct topologies of the candidates, in order (each once, whatever its organisations)."""
        return tuple(dict.fromkeys(c.topology for c in self.candidates))


@dataclass(frozen=True)
class CandidateFigures:
    """A candidate fabric built for one domain of ``size`` cards (SI units; see the module docstring).

    ``violations`` maps ``fabric_ports`` / ``connection_state`` to a one-sentence reason;
    ``a2a_latency_s + bytes_out x a2a_s_per_byte`` is one All-to-All with ``bytes_out`` leaving
    each card (``alpha`` of the system not included).
    """

    size: int
    label: str
    kind: str
    links: int
    port_links: int
    switch_chips: int
    max_hops: int
    max_chips: int
    link_bandwidth: float
    ports_used: int
    a2a_latency_s: float
    a2a_s_per_byte: float
    busiest_link: str
    busiest_link_bandwidth: float
    hosts: int
    state_bytes: float
    state_max_hosts: int
    cost_usd: float
    power_w: float
    violations: dict
    a2a_s_per_byte_uniform: float = 0.0  # k of the uniform All-to-All (= a2a_s_per_byte without skew)


def torus_shapes(size: int, max_dims: int = 3) -> list[tuple[int, ...]]:
    """Every torus of 1 to ``max_dims`` dimensions, each at least 2, whose dims multiply to
    ``size``, each shape once with its dims in non-decreasing order (permuting a torus's
    dimensions gives the same torus), ordered by dimension count then dims:
    64 -> (64), (2, 32), (4, 16), (8, 8), (2, 2, 16), (2, 4, 8), (4, 4, 4)."""
    out: list[tuple[int, ...]] = []

    def rec(rest: int, lo: int, dims: tuple[int, ...]) -> None:
        if dims and rest == 1:
            out.append(dims)
            return
        if len(dims) == max_dims:
            return
        for f in range(lo, rest + 1):
            if rest % f == 0:
                rec(rest // f, f, dims + (f,))

    rec(size, 2, ())
    return sorted(out, key=lambda d: (len(d), d))


def two_level_splits(switch_ports: int, step: int = 1) -> list[tuple[int, int]]:
    """``(down, up)`` leaf splits with ``down + up = switch_ports``, ``down >= up`` and ``up`` in
    steps of ``step`` from ``step``: 64 ports, step 8 -> (56, 8), (48, 16), (40, 24), (32, 32)."""
    return [(switch_ports - up, up) for up in range(step, switch_ports // 2 + 1, step)]


def generate_topologies(sizes: tuple[int, ...], switch_ports: int, step: int = 1) -> list[dict]:
    """The generated candidate topologies for ``sizes`` (module docstring), as ``CandidateIn``
    fields plus ``sizes`` (the sizes each applies to): tori per size (:func:`torus_shapes`), the
    one-level switched fabric, then the two-level splits (:func:`two_level_splits`) of the sizes
    with at least two leaves. Which of them the card's and the chip's ports can build is left to
    the ``fabric_ports`` cut, as for listed candidates."""
    out: list[dict] = []
    for S in sorted(sizes):
        out += [{"kind": "torus", "dims": list(d), "sizes": (S,)} for d in torus_shapes(S)]
    joined = tuple(S for S in sorted(sizes) if S > 1)
    if joined:
        out.append({"kind": "switched", "levels": 1, "sizes": joined})
    for down, up in two_level_splits(switch_ports, step):
        two = tuple(S for S in joined if S > down)
        if two:
            out.append({"kind": "switched", "levels": 2, "down_ports": down, "up_ports": up, "sizes": two})
    return out


def resolve_fabric(f: FabricSectionIn, path: Path, sizes: tuple[int, ...] = ()) -> FabricSpec:
    """Look up the switch chip, hop latency and NIC in ``instances/hardware/fabric.yaml``; SI
    units; without ``candidates`` generate them for ``sizes`` (:func:`generate_topologies`).

    Raises:
        InputError: unknown switch, hop-latency or NIC name (naming ``supernode.fabric.<field>``),
            a split step that leaves no split.
    """
    def entry(section: str, name: str, field: str) -> dict:
        try:
            return fabric_entry(section, name)
        except InputError as exc:
            raise InputError(path, f"supernode.fabric.{field}", exc.problem) from None

    chip = entry("switch_chips", f.switch, "switch") if isinstance(f.switch, str) else \
        {"ports": f.switch.ports, "port_bandwidth_gb_s": f.switch.port_bandwidth_gb_s}
    hop = f.hop_latency_ns * 1e-9 if f.hop_latency_ns is not None else \
        entry("hop_latency", f.hop_latency, "hop_latency")["hop_latency_ns"] * 1e-9
    cache = entry("nics", f.nic, "nic")["connection_cache_kib"] * conn.KIB
    ports = int(chip["ports"])
    generated = f.candidates is None
    step = None
    if generated:
        step = f.split_step_ports or 1
        if step > ports // 2:
            raise InputError(path, "supernode.fabric.split_step_ports",
                             f"{step} is more than half the {ports}-port chip: no down/up split with down >= up")
        topos = [(CandidateIn(**{k: v for k, v in t.items() if k != "sizes"}), t["sizes"])
                 for t in generate_topologies(sizes, ports, step)]
    else:
        topos = [(c, None) for c in f.candidates]
    cands = tuple(Candidate(i * len(f.connections) + j, c.kind, None if c.dims is None else tuple(c.dims),
                            c.ports_per_card, c.levels, c.down_ports, c.up_ports, org, generated, only)
                  for i, (c, only) in enumerate(topos) for j, org in enumerate(f.connections))
    return FabricSpec(
        switch=f.switch if isinstance(f.switch, str) else f"inline {ports}-port chip",
        switch_ports=ports, switch_bandwidth=float(chip["port_bandwidth_gb_s"]) * GB,
        switch_cost_usd=f.switch_cost_usd, switch_power_w=f.switch_power_w,
        card_ports=f.card_ports, port_bandwidth=f.port_bandwidth_gb_s * GB, hop_latency_s=hop, nic=f.nic,
        cache_bytes=cache, endpoints_per_host=f.endpoints_per_host, link_cost_usd=f.link_cost_usd,
        link_power_w=f.link_power_w, ub_cost_usd_per_host=f.ub_cost_usd_per_host, card_cost_usd=f.card_cost_usd,
        max_power_w=None if f.max_power_kw is None else f.max_power_kw * 1e3, max_switch_chips=f.max_switch_chips,
        candidates=cands, sources=tuple(sorted((f.source or {}).items())), generated=generated,
        split_step_ports=step)


def applies(c: Candidate, size: int) -> bool:
    """A torus applies to the size its dims multiply to; a switched fabric to every size above 1;
    a generated candidate only to the sizes it was generated for."""
    if c.sizes is not None and size not in c.sizes:
        return False
    if c.spec.kind == "torus":
        n = 1
        for d in c.spec.dims:
            n *= d
        return n == size
    return size > 1


def state_model(fs: FabricSpec, organisation: str) -> conn.StateModel:
    a = fs.endpoints_per_host
    return conn.pairwise_state(a) if organisation == "pairwise" else conn.ub_state(a)


def topology(fs: FabricSpec, c: Candidate, size: int):
    """The :class:`Torus` / :class:`Switched` of candidate ``c`` for ``size`` cards and the port
    bundle of a torus link (1 when switched).

    Raises:
        ValueError: the topology cannot be built (the fabric model's reason) or needs more ports.
    """
    s = c.spec
    if s.kind == "torus":
        need = 2 * len(s.dims)
        if need > fs.card_ports:
            raise ValueError(f"a {len(s.dims)}-D torus needs {need} ports per card, the card has {fs.card_ports}")
        bundle = fs.card_ports // need
        return Torus(tuple(s.dims), bundle * fs.port_bandwidth, fs.hop_latency_s, 0.0), bundle
    ports = s.ports_per_card or fs.card_ports
    if ports > fs.card_ports:
        raise ValueError(f"{ports} ports per card, the card has {fs.card_ports}")
    bw = min(fs.port_bandwidth, fs.switch_bandwidth)
    return Switched(size, ports, fs.switch_ports, bw, fs.hop_latency_s, 0.0, s.levels, s.down_ports, s.up_ports), 1


def figures(fs: FabricSpec, c: Candidate, size: int, server_cards: int, skew=None) -> CandidateFigures:
    """Candidate ``c`` built for a domain of ``size`` cards (cached per candidate and size);
    ``skew``: the instance's :class:`~optimizer.supernode.expert_load.ExpertLoad`, or None
    (uniform All-to-All)."""
    return _figures(fs, c, size, server_cards, skew)


@dataclass(frozen=True)
class Timing:
    """One topology's All-to-All for a size: ``latency_s`` (max chips x hop latency),
    ``s_per_byte`` (the ``k`` of the module docstring, skewed when a skew is given),
    ``s_per_byte_uniform``, the busiest directed link's ``label`` and ``bandwidth`` (bytes/s)."""

    latency_s: float
    s_per_byte: float
    s_per_byte_uniform: float
    label: str
    bandwidth: float


def skewed_s_per_byte(top, shares) -> tuple[float, str, float]:
    """``(k, label, bandwidth)`` of the skewed MoE All-to-All on ``top`` for the card shares
    ``[layers, cards]``: per layer the busiest directed link's seconds of the dispatch and of
    the combine (:func:`optimizer.model.fabric.moe_link_loads`, 1 byte of tokens per card),
    averaged over the two and over the layers, per byte a uniform exchange sends out
    (``(S-1)/S``); the label and bandwidth of the busiest link of the worst layer's exchange."""
    S = top.cards
    disp, comb = moe_link_loads(top, shares)
    bw = top.link_bandwidths()
    td, tc = disp / bw, comb / bw                      # [layers, links] seconds
    per_layer = (td.max(axis=1) + tc.max(axis=1)) / 2
    worst = td if td.max() >= tc.max() else tc
    layer, link = np.unravel_index(int(np.argmax(worst)), worst.shape)
    return float(per_layer.mean() / ((S - 1) / S)), top.link_label(int(link)), float(bw[int(link)])


@lru_cache(maxsize=4096)
def _timing(fs: FabricSpec, topo: Candidate, size: int, skew) -> Timing:
    top, _bundle = topology(fs, topo, size)
    rnd = alltoall_time(top, uniform_alltoall(size, PROBE_BYTES)).rounds[0]
    k_uniform = rnd.bandwidth_s / PROBE_BYTES
    bw = rnd.bytes_on_busiest_link / rnd.bandwidth_s if rnd.bandwidth_s else top.link_bandwidth_bytes_per_s
    if skew is None:
        return Timing(rnd.latency_s, k_uniform, k_uniform, rnd.busiest_link, bw)
    k, label, bw_skew = skewed_s_per_byte(top, skew.card_shares(size))
    return Timing(rnd.latency_s, k, k_uniform, label, bw_skew)


@lru_cache(maxsize=4096)
def _figures(fs: FabricSpec, c: Candidate, size: int, server_cards: int, skew=None) -> CandidateFigures:
    hosts = max(1, -(-size // server_cards))
    sm = state_model(fs, c.organisation)
    state = sm.bytes_for(hosts)
    violations: dict[str, str] = {}
    max_h = sm.max_hosts(fs.cache_bytes)
    if state > fs.cache_bytes:
        violations["connection_state"] = (
            f"{c.organisation} state {state / conn.KIB:,.2f} KiB per NIC for {hosts} hosts exceeds the "
            f"{fs.cache_bytes / conn.KIB:g} KiB NIC cache (fits up to {max_h} hosts)")
    try:
        top, bundle = topology(fs, c, size)
    except ValueError as exc:
        violations["fabric_ports"] = str(exc)
        return CandidateFigures(size, c.label, c.spec.kind, 0, 0, 0, 0, 0, 0.0, 0, 0.0, 0.0, "", 0.0, hosts, state,
                                max_h, 0.0, 0.0, violations)
    tm = _timing(fs, c.topology, size, skew)
    d = top.describe()
    port_links = top.links * bundle
    cost = port_links * fs.link_cost_usd + top.switch_chips * fs.switch_cost_usd
    if c.organisation == "endpoint+channel":
        cost += fs.ub_cost_usd_per_host * hosts
    power = port_links * fs.link_power_w + top.switch_chips * fs.switch_power_w
    return CandidateFigures(
        size=size, label=c.label, kind=c.spec.kind, links=top.links, port_links=port_links,
        switch_chips=top.switch_chips, max_hops=d["max_hops"], max_chips=d["max_chips"],
        link_bandwidth=top.link_bandwidth_bytes_per_s, ports_used=top.ports_per_card * bundle,
        a2a_latency_s=tm.latency_s, a2a_s_per_byte=tm.s_per_byte,
        busiest_link=tm.label, busiest_link_bandwidth=tm.bandwidth, hosts=hosts, state_bytes=state,
        state_max_hosts=max_h, cost_usd=cost, power_w=power, violations=violations,
        a2a_s_per_byte_uniform=tm.s_per_byte_uniform)


def busiest_text(fs: FabricSpec, c: Candidate, fg: CandidateFigures, bytes_out: float) -> str:
    """The binding link of one All-to-All with ``bytes_out`` leaving each card, in words, against
    what the card's ports alone would take (``bytes_out / (ports x port bandwidth)``)::

        leaf 0 up: uplinks 16 x 25 = 400 GB/s per plane, 18.1 us per exchange vs 5.2 us on the
        card's 18 ports: the leaf uplink binds
    """
    t = bytes_out * fg.a2a_s_per_byte
    ports = bytes_out / (fg.ports_used * fs.port_bandwidth) if fg.ports_used else 0.0
    name = fg.busiest_link.split(" (")[0]
    if "leaf" in name:
        what = (f"uplinks {c.up_ports} x {fg.link_bandwidth / GB:g} = {c.up_ports * fg.link_bandwidth / GB:g} GB/s "
                f"per plane")
        who = "the leaf uplink binds"
    elif c.kind == "torus":
        what = f"{fg.link_bandwidth / GB:g} GB/s"
        who = "the torus links bind (bisection)"
    else:
        what = f"{fg.link_bandwidth / GB:g} GB/s per port"
        who = "the card ports bind"
    if t <= ports * (1 + 1e-9):
        who = "the card ports bind"
    return f"{name}: {what}, {t * 1e6:,.1f} us per exchange vs {ports * 1e6:,.1f} us on the card's {fg.ports_used} ports: {who}"
