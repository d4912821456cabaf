"""Scale-up fabric topology, flows routed on it, and collectives timed by the busiest directed link
(reference chapter sections 6.5.1-6.5.4).

A fabric is ``switched`` (one or two levels of switch chips; at two levels a down/up port split at
the leaf) or ``torus`` (a ring in every dimension, two ports per card per dimension). From it the
model derives hops and chips between any two cards, the number of links and switch chips, and the
bytes each directed link carries for a traffic pattern given as flows ``(src, dst, bytes)``.

Conventions (each chosen so the chapter's figures come out of the general model):

* **Units.** SI inside: bytes, seconds, bytes/s; :class:`FabricIn` (the ``fabric:`` key) takes
  ``link_bandwidth_gb_s`` (GB = 1e9 B), ``hop_latency_ns``, ``startup_us`` and converts once.
  Message sizes in MiB are bytes (8 MiB = 8,388,608 B), so 12 MiB at 50 GB/s is
  12 x 2^20 / 50e9 s = 251.7 us.
* **Links.** ``link_bandwidth`` is per link per direction; a link is two directed links. A torus
  has ``cards x ports / 2`` links; a switched fabric one link per card port plus, at two levels,
  one per leaf uplink.
* **Routing.** Torus: dimension-ordered (dimension 0 first), the shorter way round each ring; at a
  tie (distance n/2 on an even ring) half the bytes go each way. Switched: a card's bytes are
  spread evenly over its ports (one port per plane, as NCCL spreads channels over every NVLink),
  and a leaf's bytes over its uplinks (ideal ECMP); the load of each link of such a group is the
  group's load divided by its link count.
* **Hops and chips.** ``hops`` counts links traversed; ``chips`` the routers or switch chips
  between the two cards: ``hops - 1`` intermediate cards' routers on a torus, 1 switch chip
  (same leaf or one level) or 3 (leaf, spine, leaf) when switched. A transfer's latency is
  ``chips x hop_latency``.
* **Round time.** The flows of one round run concurrently:
  ``startups x startup + max chips x hop_latency + max over directed links (bytes / bandwidth)``.
  ``startup`` is the per-round software start-up alpha (eqs. 6-9, 6-10); an All-to-All is one
  round with ``p - 1`` start-ups (one per peer, the pairwise-exchange count of
  :meth:`optimizer.model.hardware.Hardware.alltoall_s`). The chapter's round times
  (252 vs 168 us) are the bandwidth term alone (no start-up, no hop latency).
* **Messages.** ``message_bytes`` is the vector each rank holds: an AllReduce's input, a
  ReduceScatter's input, an AllGather's output.

The scale_up / scale_out pair of :mod:`optimizer.model.hardware` stays the simple case:
:meth:`Switched.from_link` is a one-level switched fabric with one port per card, and ring,
tree and uniform All-to-All on it give eqs. 6-9, 6-10 and ``Hardware.alltoall_s`` exactly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Annotated, Literal, Optional, Sequence

import numpy as np
from pydantic import Field, model_validator

from optimizer.catalog import catalog_path
from optimizer.errors import InputError
from optimizer.schema_base import StrictModel, read_yaml

GB = 1e9
NS = 1e-9
US = 1e-6


def fabric_catalog_path() -> Path:
    """``instances/hardware/fabric.yaml``: switch chips, hop latency, NIC caches, host set-up costs."""
    return catalog_path().parent / "fabric.yaml"


@lru_cache(maxsize=1)
def load_fabric_catalog() -> dict:
    """The fabric catalog as ``{section: {name: fields}}`` (sections ``switch_chips``,
    ``hop_latency``, ``nics``, ``hosts``), every entry with its ``source``.

    Raises:
        InputError: the file is missing, a section is not a mapping, or an entry has no source.
    """
    path = fabric_catalog_path()
    data = read_yaml(path)
    for section in ("switch_chips", "hop_latency", "nics", "hosts"):
        entries = data.get(section)
        if not isinstance(entries, dict):
            raise InputError(path, section, "fabric catalog section missing or not a mapping")
        for name, entry in entries.items():
            if not isinstance(entry, dict) or not entry.get("source"):
                raise InputError(path, f"{section}.{name}", "every fabric catalog entry needs a source")
    return data


def fabric_entry(section: str, name: str) -> dict:
    """One entry of the fabric catalog without its ``source``.

    Raises:
        InputError: unknown section or name (the message lists the known names).
    """
    entries = load_fabric_catalog().get(section, {})
    if name not in entries:
        raise InputError(fabric_catalog_path(), section, f"unknown name '{name}' (known: {', '.join(sorted(entries))})")
    return {k: v for k, v in entries[name].items() if k != "source"}


def _flows(src, dst, nbytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flows as int / float arrays of one length, without self-flows and empty flows."""
    s, d = np.asarray(src, dtype=np.int64).ravel(), np.asarray(dst, dtype=np.int64).ravel()
    b = np.broadcast_to(np.asarray(nbytes, dtype=float), s.shape).ravel()
    if s.shape != d.shape:
        raise ValueError(f"src has {s.size} flows, dst {d.size}")
    keep = (s != d) & (b > 0)
    return s[keep], d[keep], b[keep]


class Topology:
    """What every topology gives (torus, switched, NUMA host); subclasses fill the routing.

    Attributes every subclass has: ``cards``, ``link_bandwidth_bytes_per_s`` (per link per
    direction), ``hop_latency_s`` (per router / switch chip), ``startup_s`` (per round).
    """

    kind = "topology"
    cards: int
    link_bandwidth_bytes_per_s: float
    hop_latency_s: float
    startup_s: float

    # --- to fill
    def hops(self, src, dst) -> np.ndarray:
        """Links a transfer from card ``src`` to card ``dst`` traverses (arrays broadcast, int)."""
        raise NotImplementedError

    def chips(self, src, dst) -> np.ndarray:
        """Routers or switch chips between ``src`` and ``dst`` (0 for the same card)."""
        raise NotImplementedError

    def link_loads(self, src, dst, nbytes) -> np.ndarray:
        """Bytes on each directed link for flows ``src[i] -> dst[i]`` of ``nbytes[i]`` bytes,
        shape [:attr:`directed_links`]; for a group of parallel links (a card's ports, a leaf's
        uplinks) the load of each link of the group."""
        raise NotImplementedError

    def link_bandwidths(self) -> np.ndarray:
        """Bandwidth of each directed link (bytes/s), shape [:attr:`directed_links`]."""
        return np.full(self.directed_links, self.link_bandwidth_bytes_per_s)

    def link_label(self, i: int) -> str:
        """A name for directed link ``i`` (``card 3 -> card 4 (dim 0 +)``, ``leaf 1 up``)."""
        raise NotImplementedError

    def port_loads(self, src, dst, nbytes) -> np.ndarray:
        """Bytes through each card port, shape [cards, ports_per_card, 2] (out, in)."""
        raise NotImplementedError

    directed_links: int
    links: int
    switch_chips: int
    ports_per_card: int

    def max_hops(self) -> int:
        """Hops between the farthest pair of cards."""
        raise NotImplementedError

    # --- derived
    def mean_hops(self) -> float:
        """Mean hops over ordered pairs of distinct cards (uniform All-to-All's average path)."""
        s, d = np.meshgrid(np.arange(self.cards), np.arange(self.cards), indexing="ij")
        off = s != d
        return float(self.hops(s[off], d[off]).mean())

    def busiest_link(self, src, dst, nbytes) -> tuple[float, float, str]:
        """``(bytes, seconds, label)`` of the directed link that takes longest for these flows
        (bytes / its bandwidth); ``(0, 0, "")`` when no flow leaves its card."""
        loads = self.link_loads(src, dst, nbytes)
        if not loads.size or loads.max() <= 0:
            return 0.0, 0.0, ""
        t = loads / self.link_bandwidths()
        # the first of the links within rounding of the longest: symmetric traffic ties many
        # links, and which one wins a float tie depends on the order the bytes were summed in
        i = int(np.flatnonzero(t >= t.max() * (1 - 1e-9))[0])
        return float(loads[i]), float(t[i]), self.link_label(i)

    def describe(self) -> dict:
        """``kind, cards, links, switch_chips, ports_per_card, max_hops, max_chips`` (for reports)."""
        s, d = np.meshgrid(np.arange(self.cards), np.arange(self.cards), indexing="ij")
        return {"kind": self.kind, "cards": self.cards, "links": self.links, "switch_chips": self.switch_chips,
                "ports_per_card": self.ports_per_card, "max_hops": self.max_hops(),
                "max_chips": int(self.chips(s, d).max())}


@dataclass(frozen=True)
class Torus(Topology):
    """A torus of ``dims`` (card ``c`` at ``np.unravel_index(c, dims)``, C order), two ports per
    card per dimension, each to the ring neighbour (a 1-D torus is a bidirectional ring).

    Directed link ``(c, k, ±)`` (index ``(c·D + k)·2 + (0 for +, 1 for -)``) leaves card ``c``
    along dimension ``k``. No switch chips; the router of every intermediate card forwards.

    Raises:
        ValueError: a dimension below 2, or negative bandwidth / latency.
    """

    dims: tuple[int, ...]
    link_bandwidth_bytes_per_s: float
    hop_latency_s: float = 0.0
    startup_s: float = 0.0
    kind = "torus"

    def __post_init__(self):
        object.__setattr__(self, "dims", tuple(int(n) for n in self.dims))
        if not self.dims or min(self.dims) < 2:
            raise ValueError(f"torus dimensions must be at least 2, got {self.dims}")
        if self.link_bandwidth_bytes_per_s <= 0 or self.hop_latency_s < 0 or self.startup_s < 0:
            raise ValueError("link bandwidth must be positive, latencies non-negative")

    @property
    def cards(self) -> int:
        return int(np.prod(self.dims))

    @property
    def ports_per_card(self) -> int:
        return 2 * len(self.dims)

    @property
    def links(self) -> int:
        """``cards x ports / 2``: every link joins two ports (a size-2 ring has two parallel links)."""
        return self.cards * self.ports_per_card // 2

    @property
    def directed_links(self) -> int:
        return 2 * self.links

    switch_chips = 0

    def _coords(self, c) -> np.ndarray:
        return self._coord_table[np.asarray(c, dtype=np.int64)]

    @cached_property
    def _coord_table(self) -> np.ndarray:
        """Coordinates of every card, shape (cards, len(dims)): one lookup per flow."""
        return np.stack(np.unravel_index(np.arange(self.cards, dtype=np.int64), self.dims), axis=-1)

    def hops(self, src, dst) -> np.ndarray:
        a, b = self._coords(src), self._coords(dst)
        n = np.array(self.dims)
        fwd = (b - a) % n
        return np.minimum(fwd, n - fwd).sum(axis=-1)

    def chips(self, src, dst) -> np.ndarray:
        return np.maximum(self.hops(src, dst) - 1, 0)

    def max_hops(self) -> int:
        return int(sum(n // 2 for n in self.dims))

    def link_loads(self, src, dst, nbytes) -> np.ndarray:
        """Bytes on each directed link (index ``(card·D + k)·2 + (0: +, 1: -)``, the link leaving
        ``card`` along dimension ``k``) when every flow goes dimension by dimension (0 first),
        the shorter way round each ring, half the bytes each way at a tie (n even).

        Each flow covers a contiguous arc of one ring per dimension, so the loads are difference
        arrays over the rings (unwrapped to 2n positions, then folded), one ``bincount`` per
        dimension and direction rather than one pass per hop."""
        s, d, b = _flows(src, dst, nbytes)
        D = len(self.dims)
        loads = np.zeros((self.cards, D, 2))
        cur, goal = self._coords(s), self._coords(d)
        strides = np.array([int(np.prod(self.dims[k + 1:])) for k in range(D)], dtype=np.int64)
        for k, n in enumerate(self.dims):
            fwd = (goal[:, k] - cur[:, k]) % n
            back = (cur[:, k] - goal[:, k]) % n
            at = cur[:, k]
            ring = cur @ strides - at * strides[k]  # the card of this ring at coordinate 0
            rings_of = np.arange(self.cards)[(np.arange(self.cards) // strides[k]) % n == 0]
            width = 2 * n + 1
            row = np.searchsorted(rings_of, ring)
            for sign, steps, share in ((0, fwd, np.where(fwd < back, 1.0, np.where(fwd == back, 0.5, 0.0))),
                                       (1, back, np.where(back < fwd, 1.0, np.where(fwd == back, 0.5, 0.0)))):
                go = (share > 0) & (steps > 0)
                if not go.any():
                    continue
                w, st, a0, r = b[go] * share[go], steps[go], at[go], row[go]
                # + uses the links leaving a0 .. a0+st-1; - those leaving a0 .. a0-st+1 (shifted by n)
                lo, hi = (a0, a0 + st) if sign == 0 else (a0 - st + 1 + n, a0 + n + 1)
                diff = np.bincount(r * width + lo, weights=w, minlength=len(rings_of) * width) \
                    - np.bincount(r * width + hi, weights=w, minlength=len(rings_of) * width)
                seg = np.cumsum(diff.reshape(len(rings_of), width), axis=1)
                on_ring = seg[:, :n] + seg[:, n:2 * n]
                cards = rings_of[:, None] + np.arange(n)[None, :] * strides[k]
                loads[cards.ravel(), k, sign] += on_ring.ravel()
            cur[:, k] = goal[:, k]
        return loads.ravel()

    def link_label(self, i: int) -> str:
        c, rem = divmod(i, 2 * len(self.dims))
        k, neg = divmod(rem, 2)
        co = list(self._coords(c))
        co[k] = (co[k] + (-1 if neg else 1)) % self.dims[k]
        return f"card {c} -> card {int(np.ravel_multi_index(tuple(co), self.dims))} (dim {k} {'-' if neg else '+'})"

    def neighbour(self, c: np.ndarray, k: int, sign: int) -> np.ndarray:
        """The card one step from ``c`` along dimension ``k`` in direction ``sign`` (+1 / -1)."""
        co = self._coords(c)
        co[..., k] = (co[..., k] + sign) % self.dims[k]
        return np.ravel_multi_index(tuple(np.moveaxis(co, -1, 0)), self.dims)

    def port_loads(self, src, dst, nbytes) -> np.ndarray:
        D = len(self.dims)
        loads = self.link_loads(src, dst, nbytes).reshape(self.cards, D, 2)
        out = np.zeros((self.cards, D, 2, 2))
        out[..., 0] = loads
        c = np.arange(self.cards)
        for k in range(D):
            # port (k, +) of c faces its + neighbour, whose (k, -) link arrives there, and vice versa
            out[:, k, 0, 1] = loads[self.neighbour(c, k, +1), k, 1]
            out[:, k, 1, 1] = loads[self.neighbour(c, k, -1), k, 0]
        return out.reshape(self.cards, 2 * D, 2)


@dataclass(frozen=True)
class Switched(Topology):
    """Cards on switch chips: every card has ``ports_per_card`` ports, one into each plane.

    One level (``levels=1``): each plane is one chip's share of ports joining every card
    (``cards <= switch_ports``); a chip holds ``switch_ports // cards`` planes, so
    ``ceil(planes / (switch_ports // cards))`` chips. Two levels: per plane, leaves of
    ``down_ports`` cards with ``up_ports`` uplinks each (``down + up <= switch_ports``) and
    ``ceil(leaves x up / switch_ports)`` spine chips, each reaching every leaf
    (``leaves <= switch_ports``).

    Directed link groups (load per link of the group): ``card c up`` / ``card c down``
    (``ports_per_card`` links each) and, at two levels, ``leaf l up`` / ``leaf l down``
    (``up_ports x ports_per_card`` links each, leaf ``l`` = cards ``l·down .. l·down + down - 1``).

    Raises:
        ValueError: a port count below 1, more cards than one level or two levels reach, or a
            down/up split larger than the chip.
    """

    cards: int
    ports_per_card: int
    switch_ports: int
    link_bandwidth_bytes_per_s: float
    hop_latency_s: float = 0.0
    startup_s: float = 0.0
    levels: int = 1
    down_ports: Optional[int] = None
    up_ports: Optional[int] = None
    kind = "switched"

    def __post_init__(self):
        if self.cards < 1 or self.ports_per_card < 1 or self.switch_ports < 2:
            raise ValueError("cards, ports per card and switch ports must be positive (a switch at least 2 ports)")
        if self.link_bandwidth_bytes_per_s <= 0 or self.hop_latency_s < 0 or self.startup_s < 0:
            raise ValueError("link bandwidth must be positive, latencies non-negative")
        if self.levels == 1:
            if self.cards > self.switch_ports:
                raise ValueError(f"one level of {self.switch_ports}-port chips joins at most {self.switch_ports} "
                                 f"cards, not {self.cards}: use two levels")
        elif self.levels == 2:
            if self.down_ports is None or self.up_ports is None or self.down_ports < 1 or self.up_ports < 1:
                raise ValueError("two levels need down_ports and up_ports of at least 1")
            if self.down_ports + self.up_ports > self.switch_ports:
                raise ValueError(f"down {self.down_ports} + up {self.up_ports} ports exceed the "
                                 f"{self.switch_ports}-port chip")
            if self.leaves > self.switch_ports:
                raise ValueError(f"{self.leaves} leaves per plane exceed a {self.switch_ports}-port spine: two levels "
                                 f"reach at most {self.switch_ports * self.down_ports} cards")
        else:
            raise ValueError(f"levels must be 1 or 2, got {self.levels}")

    @classmethod
    def from_link(cls, link, cards: int) -> "Switched":
        """The scale_up (or scale_out) tier of :mod:`optimizer.model.hardware` as a fabric: one
        port per card of ``link.bandwidth_bytes_per_s`` on one switch, the round latency
        ``link.alpha_s`` as the per-round start-up and no separate chip latency (alpha has it)."""
        return cls(cards, 1, max(cards, 2), link.bandwidth_bytes_per_s, 0.0, link.alpha_s)

    @property
    def leaves(self) -> int:
        """Leaf chips per plane (1 at one level)."""
        return 1 if self.levels == 1 else -(-self.cards // self.down_ports)

    @property
    def spines(self) -> int:
        """Spine chips per plane (0 at one level)."""
        return 0 if self.levels == 1 else -(-(self.leaves * self.up_ports) // self.switch_ports)

    @property
    def switch_chips(self) -> int:
        if self.levels == 1:
            return -(-self.ports_per_card // (self.switch_ports // self.cards))
        return self.ports_per_card * (self.leaves + self.spines)

    @property
    def links(self) -> int:
        up = 0 if self.levels == 1 else self.leaves * self.up_ports
        return self.ports_per_card * (self.cards + up)

    @property
    def directed_links(self) -> int:
        # groups: card up, card down, (leaf up, leaf down)
        return 2 * self.cards + (0 if self.levels == 1 else 2 * self.leaves)

    @property
    def leaf_uplink_bandwidth_bytes_per_s(self) -> float:
        """A leaf chip's uplink bandwidth per direction, ``up_ports x link bandwidth`` (one plane)."""
        return (self.up_ports or 0) * self.link_bandwidth_bytes_per_s

    @property
    def leaf_downlink_bandwidth_bytes_per_s(self) -> float:
        """A leaf chip's bandwidth towards its cards per direction, ``down_ports x link bandwidth``."""
        return (self.down_ports or self.cards) * self.link_bandwidth_bytes_per_s

    def leaf(self, c) -> np.ndarray:
        c = np.asarray(c, dtype=np.int64)
        return np.zeros_like(c) if self.levels == 1 else c // self.down_ports

    def hops(self, src, dst) -> np.ndarray:
        src, dst = np.broadcast_arrays(np.asarray(src), np.asarray(dst))
        across = self.leaf(src) != self.leaf(dst)
        return np.where(src == dst, 0, np.where(across, 4, 2))

    def chips(self, src, dst) -> np.ndarray:
        return np.maximum(self.hops(src, dst) - 1, 0)

    def max_hops(self) -> int:
        return 4 if self.leaves > 1 else 2

    def link_loads(self, src, dst, nbytes) -> np.ndarray:
        s, d, b = _flows(src, dst, nbytes)
        C, P = self.cards, self.ports_per_card
        loads = np.zeros(self.directed_links)
        loads[:C] = np.bincount(s, b, minlength=C) / P
        loads[C:2 * C] = np.bincount(d, b, minlength=C) / P
        if self.levels == 2:
            L, across = self.leaves, self.leaf(s) != self.leaf(d)
            per_leaf = self.up_ports * P
            loads[2 * C:2 * C + L] = np.bincount(self.leaf(s[across]), b[across], minlength=L) / per_leaf
            loads[2 * C + L:] = np.bincount(self.leaf(d[across]), b[across], minlength=L) / per_leaf
        return loads

    def link_label(self, i: int) -> str:
        C = self.cards
        if i < 2 * C:
            return f"card {i % C} {'up' if i < C else 'down'} (each of {self.ports_per_card} ports)"
        j = i - 2 * C
        return f"leaf {j % self.leaves} {'up' if j < self.leaves else 'down'} (each of " \
               f"{self.up_ports * self.ports_per_card} uplinks)"

    def port_loads(self, src, dst, nbytes) -> np.ndarray:
        loads = self.link_loads(src, dst, nbytes)
        C, P = self.cards, self.ports_per_card
        out = np.zeros((C, P, 2))
        out[:, :, 0] = loads[:C, None]
        out[:, :, 1] = loads[C:2 * C, None]
        return out


@dataclass(frozen=True)
class NumaHost(Topology):
    """Cards staged through host memory on NUMA nodes (the chapter's staging example, 6.5).

    Card ``c`` hangs off node ``card_node[c]`` (one PCIe link of ``link_bandwidth`` per
    direction); nodes are joined pairwise by inter-socket links of ``socket_bandwidth``. A
    transfer is written by the sender into a buffer on node ``buffer_node(src, dst)`` and read
    from there by the receiver: ``src -> node(src) [-> buffer node] [-> node(dst)] -> dst``, so
    a buffer on a third node, or on the other node for two cards of one node, crosses the
    inter-socket link twice. ``buffer`` is ``"sender"`` (the sender's node), ``"receiver"`` or a
    node number (every buffer there).

    Directed links: ``card c up`` (0..C-1), ``card c down`` (C..2C-1), then ``node i -> node j``
    for i != j, row-major.
    """

    card_node: tuple[int, ...]
    link_bandwidth_bytes_per_s: float
    socket_bandwidth_bytes_per_s: float
    buffer: object = "sender"
    hop_latency_s: float = 0.0
    startup_s: float = 0.0
    kind = "numa"
    switch_chips = 0
    ports_per_card = 1

    def __post_init__(self):
        object.__setattr__(self, "card_node", tuple(int(n) for n in self.card_node))
        if self.buffer not in ("sender", "receiver") and not (isinstance(self.buffer, int)
                                                             and 0 <= self.buffer < self.nodes):
            raise ValueError(f"buffer must be 'sender', 'receiver' or a node 0..{self.nodes - 1}, got {self.buffer!r}")

    @property
    def cards(self) -> int:
        return len(self.card_node)

    @property
    def nodes(self) -> int:
        return max(self.card_node) + 1

    @property
    def links(self) -> int:
        return self.cards + self.nodes * (self.nodes - 1) // 2

    @property
    def directed_links(self) -> int:
        return 2 * self.cards + self.nodes * self.nodes

    def _node(self, c) -> np.ndarray:
        return np.asarray(self.card_node)[np.asarray(c, dtype=np.int64)]

    def _buffer(self, s, d) -> np.ndarray:
        if self.buffer == "sender":
            return self._node(s)
        if self.buffer == "receiver":
            return self._node(d)
        return np.full(np.shape(s), self.buffer)

    def hops(self, src, dst) -> np.ndarray:
        src, dst = np.broadcast_arrays(np.asarray(src), np.asarray(dst))
        ns, nd, nb = self._node(src), self._node(dst), self._buffer(src, dst)
        return np.where(src == dst, 0, 2 + (ns != nb) + (nb != nd))

    def chips(self, src, dst) -> np.ndarray:
        return np.maximum(self.hops(src, dst) - 1, 0)

    def max_hops(self) -> int:
        s, d = np.meshgrid(np.arange(self.cards), np.arange(self.cards))
        return int(self.hops(s, d).max())

    def link_loads(self, src, dst, nbytes) -> np.ndarray:
        s, d, b = _flows(src, dst, nbytes)
        C, N = self.cards, self.nodes
        loads = np.zeros(self.directed_links)
        loads[:C] = np.bincount(s, b, minlength=C)
        loads[C:2 * C] = np.bincount(d, b, minlength=C)
        ns, nd, nb = self._node(s), self._node(d), self._buffer(s, d)
        for a, z in ((ns, nb), (nb, nd)):  # sender writes into the buffer, receiver reads it
            x = a != z
            loads[2 * C:] += np.bincount(a[x] * N + z[x], b[x], minlength=N * N)
        return loads

    def link_bandwidths(self) -> np.ndarray:
        bw = np.full(self.directed_links, self.socket_bandwidth_bytes_per_s)
        bw[:2 * self.cards] = self.link_bandwidth_bytes_per_s
        return bw

    def socket_bytes(self, loads: np.ndarray) -> np.ndarray:
        """The inter-socket part of ``loads`` as a [nodes, nodes] matrix (``[i, j]``: i -> j)."""
        return loads[2 * self.cards:].reshape(self.nodes, self.nodes)

    def link_label(self, i: int) -> str:
        C = self.cards
        if i < 2 * C:
            return f"card {i % C} {'up' if i < C else 'down'}"
        i, j = divmod(i - 2 * C, self.nodes)
        return f"node {i} -> node {j}"

    def port_loads(self, src, dst, nbytes) -> np.ndarray:
        loads = self.link_loads(src, dst, nbytes)
        C = self.cards
        return np.stack([loads[:C], loads[C:2 * C]], axis=-1)[:, None, :]


# ----------------------------------------------------------------------------- schedules

@dataclass(frozen=True)
class Round:
    """One communication round: flows ``src[i] -> dst[i]`` of ``nbytes[i]`` bytes, concurrent;
    repeated ``repeat`` times (the p-1 identical steps of a ring), with ``startups`` software
    start-ups each (1; an All-to-All ``p - 1``). Ranks are cards here (see :func:`on_cards`)."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    repeat: int = 1
    startups: int = 1


@dataclass(frozen=True)
class RoundTime:
    """Timing of one :class:`Round`: ``bytes_on_busiest_link`` (bytes), ``busiest_link`` (its
    label), ``max_hops``, ``max_chips``, ``bandwidth_s`` (busiest link's bytes / bandwidth),
    ``latency_s`` (start-ups + chips x hop latency), ``time_s`` (their sum, one repetition)."""

    bytes_on_busiest_link: float
    busiest_link: str
    max_hops: int
    max_chips: int
    bandwidth_s: float
    latency_s: float
    time_s: float
    repeat: int


@dataclass(frozen=True)
class CollectiveTime:
    """A collective on a topology: per-round timings and totals (seconds; repeats counted)."""

    algorithm: str
    op: str
    rounds: list[RoundTime] = field(default_factory=list)

    @property
    def time_s(self) -> float:
        return sum(r.time_s * r.repeat for r in self.rounds)

    @property
    def bandwidth_s(self) -> float:
        return sum(r.bandwidth_s * r.repeat for r in self.rounds)

    @property
    def latency_s(self) -> float:
        return sum(r.latency_s * r.repeat for r in self.rounds)

    def binding(self) -> RoundTime:
        """The round that takes longest in all (its busiest link names the limit)."""
        return max(self.rounds, key=lambda r: r.time_s * r.repeat)


def time_round(top: Topology, rnd: Round) -> RoundTime:
    """Time one round on ``top`` (the module docstring's round-time convention)."""
    s, d, b = _flows(rnd.src, rnd.dst, rnd.nbytes)
    if not s.size:
        return RoundTime(0.0, "", 0, 0, 0.0, 0.0, 0.0, rnd.repeat)
    nbytes, bw_s, label = top.busiest_link(s, d, b)
    hops, chips = int(top.hops(s, d).max()), int(top.chips(s, d).max())
    lat = rnd.startups * top.startup_s + chips * top.hop_latency_s
    return RoundTime(nbytes, label, hops, chips, bw_s, lat, lat + bw_s, rnd.repeat)


def time_schedule(top: Topology, rounds: Sequence[Round], algorithm: str = "", op: str = "") -> CollectiveTime:
    """Time a schedule round by round; the total is ``sum(repeat x round time)``."""
    return CollectiveTime(algorithm, op, [time_round(top, r) for r in rounds])


def schedule_link_bytes(top: Topology, rounds: Sequence[Round]) -> np.ndarray:
    """Bytes each directed link carries over a whole schedule (repeats counted), shape
    [directed_links]."""
    total = np.zeros(top.directed_links)
    for r in rounds:
        total += r.repeat * top.link_loads(r.src, r.dst, r.nbytes)
    return total


def on_cards(rounds: Sequence[Round], cards: Sequence[int]) -> list[Round]:
    """The schedule with rank ``r`` placed on card ``cards[r]``."""
    m = np.asarray(cards, dtype=np.int64)
    return [Round(m[r.src], m[r.dst], r.nbytes, r.repeat, r.startups) for r in rounds]


def _rounds_of(op: str, rs: list[Round], ag: list[Round]) -> list[Round]:
    if op == "reduce_scatter":
        return rs
    if op == "allgather":
        return ag
    if op == "allreduce":
        return rs + ag
    raise ValueError(f"op must be allreduce, reduce_scatter or allgather, got {op!r}")


def ring_rounds(orders: Sequence[Sequence[int]] | Sequence[int], message_bytes: float, op: str = "allreduce",
                bidirectional: bool = False) -> list[Round]:
    """Ring schedule (eq. 6-9): each ring of ``q`` ranks makes ``q - 1`` steps per phase in which
    every rank sends ``message_bytes / q`` to the next one (``/ 2q`` each way when
    ``bidirectional``: two rings in opposite directions, half the vector each). ``orders`` is one
    ring (a rank order) or several disjoint rings of one size running concurrently."""
    nested = len(orders) > 0 and np.ndim(orders[0]) == 1
    rings = [list(o) for o in orders] if nested else [list(orders)]
    q = len(rings[0])
    if any(len(o) != q for o in rings):
        raise ValueError("concurrent rings must have the same size")
    if q <= 1:
        return []
    a = np.concatenate([np.asarray(o) for o in rings])
    nxt = np.concatenate([np.roll(np.asarray(o), -1) for o in rings])
    chunk = message_bytes / q
    if bidirectional:
        src, dst, b = np.concatenate([a, a]), np.concatenate([nxt, np.concatenate(
            [np.roll(np.asarray(o), 1) for o in rings])]), chunk / 2
    else:
        src, dst, b = a, nxt, chunk
    step = Round(src, dst, np.full(src.shape, b), repeat=q - 1)
    return _rounds_of(op, [step], [step])


def _log2(p: int) -> int:
    k = int(round(math.log2(p))) if p >= 1 else -1
    if p < 2 or 2 ** k != p:
        raise ValueError(f"recursive, Swing and tree schedules need a power-of-two rank count, got {p}")
    return k


def _halving_rounds(p: int, message_bytes: float, op: str, peer) -> list[Round]:
    """ReduceScatter by halving (round s: ``message / 2^(s+1)`` to ``peer(r, s)``), AllGather the
    same rounds reversed (doubling)."""
    k = _log2(p)
    r = np.arange(p)
    rs = [Round(r, peer(r, s), np.full(p, message_bytes / 2 ** (s + 1))) for s in range(k)]
    return _rounds_of(op, rs, rs[::-1])


def recursive_rounds(p: int, message_bytes: float, op: str = "allreduce") -> list[Round]:
    """Recursive halving (ReduceScatter) / doubling (AllGather), Rabenseifner's AllReduce:
    round s pairs rank r with ``r XOR 2^s`` (distance ``2^s``) and sends ``M / 2^(s+1)``.

    Raises:
        ValueError: ``p`` is not a power of two.
    """
    return _halving_rounds(p, message_bytes, op, lambda r, s: r ^ (1 << s))


def swing_rho(s: int) -> int:
    """Swing's peer distance in round s: ``rho(s) = sum_{i=0..s} (-2)^i`` = 1, -1, 3, -5, 11, ...
    (De Sensi et al., NSDI 2024)."""
    return sum((-2) ** i for i in range(s + 1))


def swing_rounds(p: int, message_bytes: float, op: str = "allreduce") -> list[Round]:
    """Swing (De Sensi et al., NSDI 2024): the halving data schedule of :func:`recursive_rounds`,
    but in round s an even rank talks to ``r + rho(s)`` and an odd one to ``r - rho(s)``
    (mod p), so peers stay close on a ring or torus dimension (distances 1, 1, 3, 5, 11, ...).

    Raises:
        ValueError: ``p`` is not a power of two.
    """
    return _halving_rounds(p, message_bytes, op,
                           lambda r, s: (r + np.where(r % 2 == 0, 1, -1) * swing_rho(s)) % p)


def tree_rounds(p: int, message_bytes: float, op: str = "allreduce") -> list[Round]:
    """Binomial tree (eq. 6-10): reduce in ``log2 p`` rounds (round s: rank ``r`` with
    ``r mod 2^(s+1) = 2^s`` sends the whole vector to ``r - 2^s``), broadcast back in the same
    rounds reversed; ``op`` is ``allreduce`` (reduce + broadcast) or ``reduce`` / ``broadcast``.

    Raises:
        ValueError: ``p`` is not a power of two, or another op.
    """
    k = _log2(p)
    r = np.arange(p)
    up = []
    for s in range(k):
        snd = r[r % 2 ** (s + 1) == 2 ** s]
        up.append(Round(snd, snd - 2 ** s, np.full(snd.shape, float(message_bytes))))
    down = [Round(x.dst, x.src, x.nbytes) for x in up[::-1]]
    if op not in ("allreduce", "reduce", "broadcast"):
        raise ValueError(f"tree op must be allreduce, reduce or broadcast, got {op!r}")
    return up if op == "reduce" else down if op == "broadcast" else up + down


def torus_ring_rounds(torus: Torus, message_bytes: float, op: str = "allreduce") -> list[Round]:
    """Dimension-ordered ring on a torus: ReduceScatter along dimension 0 (every line of cards
    along it a bidirectional ring, ``n_0 - 1`` steps of ``M / (2 n_0)`` each way), then along
    dimension 1 on the ``M / n_0`` left, and so on; AllGather in the reverse order. Every port of
    every card carries traffic in every step."""
    c = np.arange(torus.cards)
    rs, left = [], float(message_bytes)
    for k, n in enumerate(torus.dims):
        plus, minus = torus.neighbour(c, k, +1), torus.neighbour(c, k, -1)
        b = left / n / 2
        rs.append(Round(np.concatenate([c, c]), np.concatenate([plus, minus]), np.full(2 * c.size, b), repeat=n - 1))
        left /= n
    return _rounds_of(op, rs, rs[::-1])


def hierarchical_rounds(p: int, domain_cards: int, message_bytes: float, op: str = "allreduce",
                        bidirectional: bool = False) -> list[Round]:
    """Hierarchical AllReduce: ReduceScatter inside each domain of ``domain_cards`` consecutive
    ranks (concurrent rings), AllReduce of the ``M / g`` shard among the ranks of equal local
    index across domains (concurrent rings), AllGather inside the domains.

    Raises:
        ValueError: ``domain_cards`` does not divide ``p``, or another op than allreduce.
    """
    if op != "allreduce":
        raise ValueError("hierarchical schedules are AllReduce only")
    g = int(domain_cards)
    if g < 1 or p % g:
        raise ValueError(f"domains of {g} cards do not divide {p} cards")
    grid = np.arange(p).reshape(p // g, g)
    intra_rs = ring_rounds(grid, message_bytes, "reduce_scatter", bidirectional) if g > 1 else []
    inter = ring_rounds(grid.T, message_bytes / g, "allreduce", bidirectional) if p > g else []
    return intra_rs + inter + intra_rs


def uniform_alltoall(p: int, bytes_out_per_card: float) -> np.ndarray:
    """Traffic matrix [p, p] (bytes, ``[s, d]``: s -> d) of a uniform All-to-All: each card
    sends ``bytes_out_per_card`` split evenly over the other ``p - 1`` (zero diagonal)."""
    t = np.full((p, p), bytes_out_per_card / max(p - 1, 1))
    np.fill_diagonal(t, 0.0)
    return t


def skewed_alltoall(bytes_out_per_card: float, share: Sequence[float]) -> np.ndarray:
    """Traffic matrix [p, p] of an MoE dispatch with uneven expert load: card s sends
    ``bytes_out_per_card`` over the other cards in proportion to ``share[d]`` (the fraction of
    routed tokens card d's experts take). A uniform ``share`` gives :func:`uniform_alltoall`;
    the combine is the transpose.

    Raises:
        ValueError: a negative share, or a card whose peers have no share.
    """
    w = np.asarray(share, dtype=float)
    if (w < 0).any():
        raise ValueError("expert load shares must be non-negative")
    t = np.broadcast_to(w, (w.size, w.size)).copy()
    np.fill_diagonal(t, 0.0)
    rows = t.sum(axis=1, keepdims=True)
    if (rows <= 0).any():
        raise ValueError("every card needs a peer with a positive share")
    return bytes_out_per_card * t / rows


def alltoall_rounds(traffic: np.ndarray) -> list[Round]:
    """An All-to-All of traffic matrix ``traffic`` [p, p] (bytes): one round of every flow at
    once, with ``p - 1`` start-ups (one per peer)."""
    t = np.asarray(traffic, dtype=float)
    s, d = np.nonzero(t)
    return [Round(s, d, t[s, d], startups=max(t.shape[0] - 1, 1))]


ALGORITHMS = ("ring", "ring_bidirectional", "tree", "recursive", "swing", "torus_ring", "hierarchical")


def collective_time(top: Topology, algorithm: str, op: str, message_bytes: float,
                    cards: Optional[Sequence[int]] = None, domain_cards: Optional[int] = None) -> CollectiveTime:
    """Time ``op`` (allreduce, reduce_scatter, allgather; tree also reduce, broadcast) of a
    ``message_bytes`` vector per rank with ``algorithm`` (:data:`ALGORITHMS`) on ``top``, rank r
    on card ``cards[r]`` (default: every card, rank r on card r). ``torus_ring`` needs a
    :class:`Torus` and every card; ``hierarchical`` needs ``domain_cards``.

    Raises:
        ValueError: unknown algorithm or op, a rank count the algorithm cannot take, or a
            missing ``domain_cards``.
    """
    cards = list(range(top.cards)) if cards is None else list(cards)
    p = len(cards)
    if algorithm in ("ring", "ring_bidirectional"):
        rounds = ring_rounds(list(range(p)), message_bytes, op, algorithm == "ring_bidirectional")
    elif algorithm == "tree":
        rounds = tree_rounds(p, message_bytes, op)
    elif algorithm == "recursive":
        rounds = recursive_rounds(p, message_bytes, op)
    elif algorithm == "swing":
        rounds = swing_rounds(p, message_bytes, op)
    elif algorithm == "torus_ring":
        if not isinstance(top, Torus) or p != top.cards:
            raise ValueError("torus_ring runs on a Torus over all its cards")
        rounds = torus_ring_rounds(top, message_bytes, op)
    elif algorithm == "hierarchical":
        if domain_cards is None:
            raise ValueError("hierarchical needs domain_cards")
        rounds = hierarchical_rounds(p, domain_cards, message_bytes, op)
    else:
        raise ValueError(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    return time_schedule(top, on_cards(rounds, cards), algorithm, op)


def alltoall_time(top: Topology, traffic: np.ndarray, cards: Optional[Sequence[int]] = None) -> CollectiveTime:
    """Time an All-to-All of traffic matrix ``traffic`` [p, p] (bytes) on ``top``, rank r on
    card ``cards[r]`` (default r): every flow at once, the busiest link's bytes / bandwidth,
    ``p - 1`` start-ups and the farthest flow's chips x hop latency."""
    rounds = alltoall_rounds(traffic)
    if cards is not None:
        rounds = on_cards(rounds, cards)
    return time_schedule(top, rounds, "direct", "alltoall")


def moe_dispatch_combine_time(top: Topology, bytes_out_per_card: float, share: Optional[Sequence[float]] = None,
                              cards: Optional[Sequence[int]] = None) -> CollectiveTime:
    """MoE dispatch (``skewed_alltoall`` by expert load ``share``; uniform when None) then
    combine (its transpose): two All-to-All rounds on ``top``."""
    p = top.cards if cards is None else len(cards)
    t = uniform_alltoall(p, bytes_out_per_card) if share is None else skewed_alltoall(bytes_out_per_card, share)
    a, b = alltoall_time(top, t, cards), alltoall_time(top, t.T, cards)
    return CollectiveTime("direct", "moe_dispatch_combine", a.rounds + b.rounds)


def moe_traffic(share: Sequence[float], bytes_per_card: float = 1.0) -> np.ndarray:
    """Traffic matrix [p, p] of an MoE dispatch in which every card routes its tokens' copies
    (``bytes_per_card`` in all, the local ones included) to card d in proportion to ``share[d]``,
    the fraction of routed tokens card d's experts take: card s sends ``bytes_per_card x
    share[d]`` to every d != s, and the ``share[s]`` part stays on s. A uniform share gives
    :func:`uniform_alltoall` with ``bytes_per_card (p-1)/p`` out of every card; the combine is the
    transpose. (:func:`skewed_alltoall` instead gives every card the same bytes out.)

    Raises:
        ValueError: a negative share.
    """
    w = np.asarray(share, dtype=float)
    if (w < 0).any():
        raise ValueError("expert load shares must be non-negative")
    t = np.broadcast_to(bytes_per_card * w, (w.size, w.size)).copy()
    np.fill_diagonal(t, 0.0)
    return t


def moe_link_loads(top: Topology, shares) -> tuple[np.ndarray, np.ndarray]:
    """Bytes on every directed link of the dispatch and of the combine of :func:`moe_traffic`
    (1 byte per card) for each row of ``shares`` [layers, cards]: two arrays [layers,
    directed_links] (for a group of parallel links, the load of each link).

    The loads are linear in the shares: ``loads = A @ share`` with column d of ``A`` the loads of
    one byte from every other card to card d (combine: from card d to every other), routed by
    ``top.link_loads``. On a :class:`Torus` routing is translation invariant (dimension-ordered,
    shortest way, ties split), so ``A`` comes from the flows to (and from) card 0 alone, shifted:
    link ``(c, k, ±)`` carries for destination d what link ``(c - d, k, ±)`` carries for card 0.
    Equal to ``link_loads`` of the explicit traffic matrix (``tests/test_fabric.py``).
    """
    sh = np.atleast_2d(np.asarray(shares, dtype=float))
    p = top.cards
    if sh.shape[1] != p:
        raise ValueError(f"shares cover {sh.shape[1]} cards, the fabric has {p}")
    others = np.arange(p)
    if isinstance(top, Torus):
        D = len(top.dims)
        to0 = top.link_loads(others, np.zeros(p, dtype=np.int64), np.ones(p)).reshape(p, D, 2)
        from0 = top.link_loads(np.zeros(p, dtype=np.int64), others, np.ones(p)).reshape(p, D, 2)
        co = top._coords(others)
        n = np.array(top.dims)
        diff = (co[:, None, :] - co[None, :, :]) % n  # [c, d]: coordinates of c - d
        idx = np.ravel_multi_index(tuple(np.moveaxis(diff, -1, 0)), top.dims)
        # A[c, d, k, s] = to0[c - d, k, s]; loads[l, c, k, s] = sum_d share[l, d] A[c, d, k, s]
        disp = np.einsum("ld,cdks->lcks", sh, to0[idx]).reshape(sh.shape[0], -1)
        comb = np.einsum("ld,cdks->lcks", sh, from0[idx]).reshape(sh.shape[0], -1)
        return disp, comb
    a_disp = np.empty((top.directed_links, p))
    a_comb = np.empty((top.directed_links, p))
    for d in range(p):
        a_disp[:, d] = top.link_loads(others, np.full(p, d), np.ones(p))
        a_comb[:, d] = top.link_loads(np.full(p, d), others, np.ones(p))
    return sh @ a_disp.T, sh @ a_comb.T


# ----------------------------------------------------------------------------- the `fabric:` key

PosFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
PosInt = Annotated[int, Field(strict=True, ge=1)]


class FabricIn(StrictModel):
    """A ``fabric:`` description in an instance file (units in the names; :meth:`build` converts).

    ``kind: torus`` takes ``dims`` (product = ``cards``; ``ports_per_card``, if given, must be
    ``2 x len(dims)``); ``kind: switched`` takes ``ports_per_card``, ``switch_ports``, ``levels``
    (1 or 2) and at two levels ``down_ports`` / ``up_ports``. ``switch`` names a chip of
    ``instances/hardware/fabric.yaml`` (``switch_chips``) whose ``ports`` and
    ``port_bandwidth_gb_s`` fill ``switch_ports`` and ``link_bandwidth_gb_s`` when not given.
    ``hop_latency_ns`` is per router or switch chip, ``startup_us`` the per-round start-up alpha.
    """

    kind: Literal["switched", "torus"]
    cards: PosInt
    link_bandwidth_gb_s: Optional[PosFloat] = None
    hop_latency_ns: NonNegFloat = 0.0
    startup_us: NonNegFloat = 0.0
    dims: Optional[list[PosInt]] = None
    ports_per_card: Optional[PosInt] = None
    switch: Optional[str] = None
    switch_ports: Optional[PosInt] = None
    levels: Literal[1, 2] = 1
    down_ports: Optional[PosInt] = None
    up_ports: Optional[PosInt] = None

    @model_validator(mode="after")
    def _check(self):
        if self.kind == "torus":
            if not self.dims:
                raise ValueError("a torus needs dims")
            if int(np.prod(self.dims)) != self.cards:
                raise ValueError(f"dims {self.dims} hold {int(np.prod(self.dims))} cards, not {self.cards}")
            if self.ports_per_card is not None and self.ports_per_card != 2 * len(self.dims):
                raise ValueError(f"a {len(self.dims)}-D torus has {2 * len(self.dims)} ports per card")
            if self.switch or self.switch_ports or self.down_ports or self.up_ports:
                raise ValueError("a torus has no switch chips (switch, switch_ports, down_ports, up_ports)")
        else:
            if self.dims is not None:
                raise ValueError("dims are for a torus")
            if self.ports_per_card is None:
                raise ValueError("a switched fabric needs ports_per_card")
            if self.switch is None and self.switch_ports is None:
                raise ValueError("a switched fabric needs switch_ports or a switch chip name")
            if self.levels == 2 and (self.down_ports is None or self.up_ports is None):
                raise ValueError("two levels need down_ports and up_ports")
        if self.link_bandwidth_gb_s is None and self.switch is None:
            raise ValueError("link_bandwidth_gb_s is required (or a switch chip name that gives it)")
        return self

    def build(self, file: str | Path = "fabric") -> Topology:
        """The :class:`Torus` or :class:`Switched` in SI units.

        Raises:
            InputError: an unknown switch chip, or a topology the ports cannot build
                (the :class:`Switched` / :class:`Torus` errors, naming ``fabric``).
        """
        chip = fabric_entry("switch_chips", self.switch) if self.switch else {}
        bw = (self.link_bandwidth_gb_s or chip.get("port_bandwidth_gb_s")) * GB
        try:
            if self.kind == "torus":
                return Torus(tuple(self.dims), bw, self.hop_latency_ns * NS, self.startup_us * US)
            return Switched(self.cards, self.ports_per_card, self.switch_ports or chip["ports"], bw,
                            self.hop_latency_ns * NS, self.startup_us * US, self.levels, self.down_ports,
                            self.up_ports)
        except ValueError as exc:
            raise InputError(file, "fabric", str(exc)) from None
