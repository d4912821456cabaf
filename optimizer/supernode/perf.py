"""Supernode performance model: pure functions (numpy, no solver imports).

Everything is per card of one instance spanning S cards, in SI units (bytes, seconds, FLOP).
Sources (reference chapter, section 6.7.4 and exercise 6-11):

* weights per card, eq 6-14: ``W_card = W_replicated + (W_experts + W_tables_in_hbm) / S``;
  sessions per card ``N = floor((C - W_card - U) / K)`` (memory per card, eq 6-1).
* decode step for N sessions per card::

      step = max(HBM reads / B_HBM, KV reads / B_KV tier, FLOPs / P) + 2 x MoE layers x T_A2A
             + prefetch excess + T_fixed

  HBM reads = replicated read + routed-expert bytes the card's experts are touched for
  (uniform routing: each of the card's E/S experts is touched unless all N x S tokens of the
  instance miss it, probability ``(1 - k/E)^(N S)``) + KV read x N (KV in HBM) + looked-up
  table rows in HBM. ``T_A2A = alpha + N x d x (S-1)/S / B_link`` inside one scale-up domain;
  an instance spanning servers over the NIC sends the share ``(S - s)/S`` (s cards per server)
  over the NIC and ``(s-1)/S`` over NVLink, concurrently (the slower one counts).
  With ``supernode.expert_load`` (:mod:`optimizer.supernode.expert_load`) card d's experts take
  ``share_d`` of the tokens and every card sends ``N d share_d`` to card d: the NVLink domain
  takes its busiest port (a one-level switch of one port per card, the fabric model's
  :func:`~optimizer.model.fabric.moe_link_loads`), ``T_A2A = alpha + N d x mean over the trace's
  layers of (dispatch + combine) / 2 of max(max_s (1 - share_s), (S-1) max_d share_d) / B``; the
  NIC-joined instance per layer the busiest card's bytes on each path, out (its tokens to the
  other cards of its server / of other servers) or in (``share_d`` of every card of its
  server / of the others), ``T_A2A = mean over layers of max(NVLink, NIC)``; a candidate fabric
  its own busiest link (:mod:`optimizer.supernode.fabric`). The expert reads below stay uniform.
* single-user token, eq 6-15: ``max(T_weight, T_KV, T_compute) / eta + T_comm + T_fixed`` with
  ``T_weight`` = replicated read / B_HBM, ``T_KV`` = one session's KV read over the KV tier,
  ``T_comm`` = a x MoE layers x T_A2A for one token, with a =
  ``single_user_all_to_all_per_moe_layer`` (1, the chapter's count: a single token's dispatch and
  combine as one latency-bound exchange; 2 counts them separately as the batch step does).
* lookup prefetch: a table consumed at block l (0-based) has ``l`` blocks of the step to arrive
  (``l x step / layers``; the first block for the Engram table at layer 1); a fetch longer than
  that adds the excess to the step. Fetch time per tier (rows of the card's N tokens):
  host ``RTT + max(rows x s / reads_per_s, bytes / B_PCIe)`` (the server's s cards share the
  host's random-read rate), pool ``L + transaction bytes / min(B_path, u q / L)`` (eq 6-12),
  ROM ``hops x per-hop latency + bytes / B_ROM``, SRAM ``latency + bytes / B``.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from optimizer.supernode.schema import GB, Problem

SCALE_UP = "scale_up"
CROSS_SERVER = "cross_server"
FABRIC = "fabric"  # a candidate of ``supernode.fabric`` (optimizer/supernode/fabric.py)


@dataclass(frozen=True)
class Option:
    """One way to build an instance: S cards, how they are joined, a tier per table, the KV tier."""

    size: int
    fabric: str
    tables: tuple[str, ...]
    kv: str
    candidate: int | None = None  # index into ``p.fabric.candidates`` when ``fabric == FABRIC``

    def label(self, p: Problem) -> str:
        if self.fabric == FABRIC:
            fab = p.fabric.candidates[self.candidate].label
        else:
            fab = "NVLink" if self.fabric == SCALE_UP else "NIC"
        tabs = ",".join(self.tables) if self.tables else "-"
        return f"S={self.size} {fab}, tables {tabs}, KV {self.kv}"


@dataclass
class Figures:
    """An option evaluated at N sessions per card (SI units; see the module docstring)."""

    sessions_per_card: int
    weights_per_card: float
    hbm_used: float
    kv_per_session: float
    hbm_reads: float
    experts_read: float
    t_hbm: float
    t_kv: float
    t_compute: float
    t_a2a: float
    t_comm: float
    prefetch_excess: float
    prefetch: dict[str, dict[str, float]]
    step: float

    @property
    def tokens_per_s_card(self) -> float:
        return self.sessions_per_card / self.step


@dataclass
class SingleUser:
    """Eq 6-15 figures for one session on the instance (seconds)."""

    t_weight: float
    t_kv: float
    t_compute: float
    t_comm: float
    t_fixed: float
    prefetch_excess: float
    token: float
    window_first_block: float
    prefetch: dict[str, dict[str, float]]


@dataclass
class OptionResult:
    """An option with its best batch and the reasons it cannot be built (empty when it can).

    ``violations`` maps a constraint family to a one-sentence reason; ``limit`` names what
    caps the sessions per card (``memory``, ``host_capacity``, ``pool_capacity`` or ``slo``).
    """

    option: Option
    sessions_per_card: int
    limit: str
    violations: dict[str, str]
    figures: Figures | None
    single: SingleUser
    weights_per_card: float
    host_bytes_per_server: float
    pool_bytes: float
    card_tier_bytes: dict[str, float] = field(default_factory=dict)
    caps: dict[str, int] = field(default_factory=dict)
    fabric: Any = None  # the candidate fabric's figures (optimizer.supernode.fabric.CandidateFigures), or None

    @property
    def feasible(self) -> bool:
        return not self.violations and self.figures is not None

    @property
    def tokens_per_s_instance(self) -> float:
        return 0.0 if self.figures is None else self.figures.tokens_per_s_card * self.option.size

    @property
    def sessions_instance(self) -> int:
        return self.sessions_per_card * self.option.size


def table_extra_share(p: Problem) -> float:
    """Bytes stored with the tables (e.g. projections) per table byte, spread in proportion."""
    inv = p.inventory
    return inv.table_extra_bytes / inv.table_bytes if inv.table_bytes else 0.0


def weights_per_card(p: Problem, size: int, tables_in_hbm: tuple[bool, ...]) -> float:
    """Eq 6-14: ``W_replicated_resident + (W_routed + W_tables_in_hbm) / S`` bytes per card."""
    inv = p.inventory
    share = 1 + table_extra_share(p)
    tab = sum(t.bytes * share for t, h in zip(inv.tables, tables_in_hbm) if h)
    return inv.replicated_resident_bytes + (inv.routed_bytes + tab) / size


def experts_read_per_card(p: Problem, size: int, tokens_in_instance):
    """Expected routed-expert bytes one card reads per step (uniform routing; array-friendly)."""
    inv = p.inventory
    if inv.routed_experts == 0:
        return 0.0 * np.asarray(tokens_in_instance, dtype=float)
    miss = (1.0 - inv.experts_per_token / inv.routed_experts) ** np.asarray(tokens_in_instance, dtype=float)
    return inv.moe_layers * (inv.routed_experts / size) * (1.0 - miss) * inv.expert_bytes


def fabric_figures(p: Problem, opt: Option):
    """The candidate fabric of ``opt`` built for its size (:func:`optimizer.supernode.fabric.figures`),
    None for an option without one."""
    if opt.fabric != FABRIC:
        return None
    from optimizer.supernode.fabric import figures as fabric_figs

    return fabric_figs(p.fabric, p.fabric.candidates[opt.candidate], opt.size, p.hw.server_cards, p.expert_load)


@lru_cache(maxsize=256)
def nvlink_skew_fraction(skew, size: int) -> float:
    """Busiest NVLink port's bytes per byte of a card's tokens under ``skew``: the mean over the
    trace's layers of (dispatch + combine) / 2, a one-level switch of one port per card
    (:func:`optimizer.supernode.fabric.skewed_s_per_byte` at 1 B/s, times (S-1)/S); (S-1)/S uniform."""
    from optimizer.model.fabric import Switched
    from optimizer.supernode.fabric import skewed_s_per_byte

    k, _label, _bw = skewed_s_per_byte(Switched(size, 1, max(size, 2), 1.0), skew.card_shares(size))
    return k * (size - 1) / size


@lru_cache(maxsize=256)
def cross_server_skew_fractions(skew, size: int, server_cards: int) -> tuple[np.ndarray, np.ndarray]:
    """Per layer of the trace, the busiest card's NVLink and NIC bytes per byte of a card's
    tokens for a NIC-joined instance of ``size`` cards, servers of ``server_cards`` in order:
    ``max(out, in)`` on each path, with out = the shares of the other cards of its server (NIC:
    of the other servers) and in = its share x (server_cards - 1) (NIC: x (size - server_cards));
    ``(s-1)/S`` and ``(S-s)/S`` uniform. Dispatch and combine (the transpose) have the same maxima."""
    sh = skew.card_shares(size)                                   # [layers, S]
    srv = sh.reshape(sh.shape[0], size // server_cards, server_cards).sum(axis=2)
    own = np.repeat(srv, server_cards, axis=1)                    # the card's server's share
    nv = np.maximum((own - sh).max(axis=1), sh.max(axis=1) * (server_cards - 1))
    nic = np.maximum((1.0 - own).max(axis=1), sh.max(axis=1) * (size - server_cards))
    return nv, nic


def a2a_time(p: Problem, opt: Option, tokens_per_card):
    """One All-to-All (dispatch or combine) for ``tokens_per_card`` tokens per card, seconds.

    On a candidate fabric: ``alpha + (max chips x hop latency) + N d (S-1)/S x k`` with ``k`` the
    busiest directed link's seconds per byte leaving a card (:mod:`optimizer.supernode.fabric`);
    with an expert-load skew, the busiest link under it (module docstring)."""
    hw, inv, S = p.hw, p.inventory, opt.size
    b = np.asarray(tokens_per_card, dtype=float) * inv.dispatch_bytes_per_token
    if S <= 1 or inv.moe_layers == 0:
        return 0.0 * b
    skew = p.expert_load
    if opt.fabric == FABRIC:
        fg = fabric_figures(p, opt)
        return hw.nvlink_latency_s + fg.a2a_latency_s + b * (S - 1) / S * fg.a2a_s_per_byte
    if opt.fabric == SCALE_UP:
        share = (S - 1) / S if skew is None else nvlink_skew_fraction(skew, S)
        return hw.nvlink_latency_s + b * share / hw.nvlink_bandwidth
    s = min(S, hw.server_cards)
    if skew is None:
        inside = hw.nvlink_latency_s + b * (s - 1) / S / hw.nvlink_bandwidth
        outside = hw.nic_latency_s + b * (S - s) / S / hw.nic_bandwidth
        return np.maximum(inside, outside)
    nv, nic = cross_server_skew_fractions(skew, S, s)
    bb = b[..., None]
    inside = hw.nvlink_latency_s + bb * nv / hw.nvlink_bandwidth
    outside = hw.nic_latency_s + bb * nic / hw.nic_bandwidth
    return np.maximum(inside, outside).mean(axis=-1)


def fetch_times(p: Problem, opt: Option, tokens_per_card) -> dict[str, tuple[np.ndarray, int]]:
    """Fetch time of the looked-up rows per non-HBM tier, with the earliest consuming layer.

    Returns ``{tier: (seconds per step as an array over tokens_per_card, layer)}``.
    """
    inv, hw = p.inventory, p.hw
    n = np.asarray(tokens_per_card, dtype=float)
    out: dict[str, tuple[np.ndarray, int]] = {}
    for tier_name in sorted(set(opt.tables) - {"hbm"}):
        tabs = [t for t, tn in zip(inv.tables, opt.tables) if tn == tier_name]
        rows = n * sum(t.rows_per_token for t in tabs)
        nbytes = n * sum(t.rows_per_token * t.row_bytes for t in tabs)
        tier = hw.tiers[tier_name]
        if tier_name == "host":
            t = tier.latency_s + np.maximum(rows * hw.server_cards / tier.reads_per_s, nbytes / tier.bandwidth)
        elif tier_name == "pool":
            q = tier.transaction_bytes
            txn = n * sum(t.rows_per_token * math.ceil(t.row_bytes / q) * q for t in tabs)
            t = tier.latency_s + txn / tier.bandwidth
        else:
            t = tier.latency_s + nbytes / tier.bandwidth
        out[tier_name] = (t, min(tb.layer for tb in tabs))
    return out


def _kv_bandwidth(p: Problem, tier: str) -> float:
    return p.hw.hbm_bandwidth if tier == "hbm" else p.hw.tiers[tier].bandwidth


def _prefetch(p: Problem, opt: Option, tokens, base):
    """Excess of each tier's fetch over its window; returns (excess array, per-tier detail)."""
    layers = p.inventory.layers
    excess = np.zeros_like(np.asarray(base, dtype=float))
    detail = {}
    for tier, (t, layer) in fetch_times(p, opt, tokens).items():
        window = layer * np.asarray(base) / layers
        ex = np.maximum(0.0, t - window)
        excess = np.maximum(excess, ex)
        detail[tier] = (t, window, layer)
    return excess, detail


def step_times(p: Problem, opt: Option, n: np.ndarray) -> dict[str, np.ndarray]:
    """Decode step for N sessions per card (array), with its parts (seconds, bytes)."""
    inv, hw, S = p.inventory, p.hw, opt.size
    ctx = p.context_tokens
    n = np.asarray(n, dtype=float)
    kv_read = inv.kv_read_bytes.at(ctx)
    experts = experts_read_per_card(p, S, n * S)
    lookups = n * sum(t.rows_per_token * t.row_bytes for t, tn in zip(inv.tables, opt.tables) if tn == "hbm")
    hbm_reads = inv.replicated_read_bytes + experts + lookups + (n * kv_read if opt.kv == "hbm" else 0.0)
    t_hbm = hbm_reads / hw.hbm_bandwidth
    t_kv = np.zeros_like(n) if opt.kv == "hbm" else n * kv_read / _kv_bandwidth(p, opt.kv)
    t_compute = n * inv.flops_per_token.at(ctx) / hw.flops
    t_a2a = a2a_time(p, opt, n)
    t_comm = 2 * inv.moe_layers * t_a2a
    base = np.maximum(np.maximum(t_hbm, t_kv), t_compute) + t_comm + p.fixed_s
    excess, _ = _prefetch(p, opt, n, base)
    return {"hbm_reads": hbm_reads, "experts": experts, "t_hbm": t_hbm, "t_kv": t_kv, "t_compute": t_compute,
            "t_a2a": t_a2a, "t_comm": t_comm, "excess": excess, "base": base, "step": base + excess}


def figures(p: Problem, opt: Option, n: int) -> Figures:
    """All figures of ``opt`` at ``n`` sessions per card."""
    st = step_times(p, opt, np.array([float(n)]))
    w = weights_per_card(p, opt.size, tuple(t == "hbm" for t in opt.tables))
    k = p.inventory.kv_capacity_bytes.at(p.context_tokens)
    _, det = _prefetch(p, opt, np.array([float(n)]), st["base"])
    pre = {tier: {"fetch_s": float(t[0]), "window_s": float(wd[0]), "layer": layer,
                  "excess_s": float(max(0.0, t[0] - wd[0]))} for tier, (t, wd, layer) in det.items()}
    return Figures(
        sessions_per_card=n, weights_per_card=w,
        hbm_used=w + p.reserve_bytes + (n * k if opt.kv == "hbm" else 0.0), kv_per_session=k,
        hbm_reads=float(st["hbm_reads"][0]), experts_read=float(st["experts"][0]), t_hbm=float(st["t_hbm"][0]),
        t_kv=float(st["t_kv"][0]), t_compute=float(st["t_compute"][0]), t_a2a=float(st["t_a2a"][0]),
        t_comm=float(st["t_comm"][0]), prefetch_excess=float(st["excess"][0]), prefetch=pre, step=float(st["step"][0]))


def single_user(p: Problem, opt: Option) -> SingleUser:
    """Eq 6-15: one session's token time on the instance (see the module docstring)."""
    inv, hw = p.inventory, p.hw
    ctx = p.context_tokens
    lookups = sum(t.rows_per_token * t.row_bytes for t, tn in zip(inv.tables, opt.tables) if tn == "hbm")
    t_weight = (inv.replicated_read_bytes + lookups) / hw.hbm_bandwidth
    t_kv = inv.kv_read_bytes.at(ctx) / _kv_bandwidth(p, opt.kv)
    t_compute = inv.flops_per_token.at(ctx) / hw.flops
    t_comm = float(p.single_user_a2a * inv.moe_layers * a2a_time(p, opt, 1.0))
    base = max(t_weight, t_kv, t_compute) / p.overlap_efficiency + t_comm + p.fixed_s
    one = np.array([1.0])
    excess, det = _prefetch(p, opt, one, np.array([base]))
    pre = {tier: {"fetch_s": float(t[0]), "window_s": float(wd[0]), "layer": layer,
                  "excess_s": float(max(0.0, t[0] - wd[0]))} for tier, (t, wd, layer) in det.items()}
    return SingleUser(t_weight, t_kv, t_compute, t_comm, p.fixed_s, float(excess[0]), base + float(excess[0]),
                      base / inv.layers, pre)


def options(p: Problem) -> list[Option]:
    """Every option the instance allows: sizes x fabrics x a tier per table x a KV tier. With a
    ``supernode.fabric`` section the fabrics of a size are the candidates that join it (instead
    of the system's NVLink domain), in the order listed, each organisation in turn."""
    inv, hw = p.inventory, p.hw
    out = []
    per_table = [p.table_tiers[t.name] for t in inv.tables]
    for S in p.sizes:
        fabrics: list[tuple[str, int | None]] = []
        if p.fabric is not None:
            from optimizer.supernode.fabric import applies

            fabrics += [(FABRIC, c.index) for c in p.fabric.candidates if applies(c, S)]
        elif S <= hw.max_scale_up_cards:
            fabrics.append((SCALE_UP, None))
        if p.allow_cross_server and S > hw.server_cards and S % hw.server_cards == 0:
            fabrics.append((CROSS_SERVER, None))
        for fab, cand in fabrics:
            for tabs in itertools.product(*per_table):
                for kv in p.kv_tiers:
                    out.append(Option(S, fab, tuple(tabs), kv, cand))
    return out


def evaluate_option(p: Problem, opt: Option, max_sessions: int = 100_000) -> OptionResult:
    """Best batch of an option: the most sessions per card that memory, the tiers and the
    per-token service target allow, and the reasons the option cannot be built at all."""
    inv, hw, S = p.inventory, p.hw, opt.size
    share = 1 + table_extra_share(p)
    k = inv.kv_capacity_bytes.at(p.context_tokens)
    w = weights_per_card(p, S, tuple(t == "hbm" for t in opt.tables))
    violations: dict[str, str] = {}
    caps: dict[str, int] = {}
    free_hbm = hw.memory_bytes - w - p.reserve_bytes
    if opt.kv == "hbm":
        caps["memory"] = int(math.floor(free_hbm / k + 1e-9)) if free_hbm > 0 else 0
        if caps["memory"] < 1:
            violations["memory"] = (f"{w / GB:.1f} GB of weights per card and {p.reserve_bytes / GB:.2f} GB reserve "
                                    f"leave {free_hbm / GB:.2f} GB of {hw.memory_bytes / GB:g} GB, less than one "
                                    f"session's {k / GB:.3f} GB of KV")
    elif free_hbm < 0:
        violations["memory"] = (f"{w / GB:.1f} GB of weights per card and the reserve exceed "
                                f"{hw.memory_bytes / GB:g} GB")
    host_tables = sum(t.bytes * share for t, tn in zip(inv.tables, opt.tables) if tn == "host")
    host_per_server = host_tables * hw.server_cards / S
    card_tier = {}
    for tier_name in ("rom", "sram"):
        b = sum(t.bytes * share for t, tn in zip(inv.tables, opt.tables) if tn == tier_name) / S
        if b:
            card_tier[tier_name] = b
            cap = hw.tiers[tier_name].capacity_bytes
            if b > cap:
                violations["tier_capacity"] = (f"{tier_name} needs {b / GB:.3f} GB per card at S={S}, "
                                               f"holds {cap / GB:.3f} GB")
    if "host" in hw.tiers:
        cap = hw.tiers["host"].capacity_bytes
        if opt.kv == "host":
            free = cap - host_per_server
            caps["host_capacity"] = int(math.floor(free / (hw.server_cards * k) + 1e-9)) if free > 0 else 0
        if host_per_server > cap or (opt.kv == "host" and caps["host_capacity"] < 1):
            violations["tier_capacity"] = (f"host memory needs {host_per_server / GB:,.1f} GB per server for tables"
                                           f"{' plus KV' if opt.kv == 'host' else ''} at S={S}, holds {cap / GB:,.0f} GB")
    pool_tables = sum(t.bytes * share for t, tn in zip(inv.tables, opt.tables) if tn == "pool")
    if "pool" in hw.tiers:
        cap = hw.tiers["pool"].capacity_bytes
        if opt.kv == "pool":
            free = cap - pool_tables
            caps["pool_capacity"] = int(math.floor(free / (S * k) + 1e-9)) if free > 0 else 0
        if pool_tables > cap or (opt.kv == "pool" and caps["pool_capacity"] < 1):
            violations["pool_capacity"] = (f"one instance needs {pool_tables / GB:,.1f} GB of tables"
                                           f"{' plus KV' if opt.kv == 'pool' else ''} in the pool, "
                                           f"which holds {cap / GB:,.0f} GB")
    fg = fabric_figures(p, opt)
    if fg is not None:
        violations.update(fg.violations)
        if "fabric_ports" in fg.violations:  # no topology to time: the option cannot be built
            return OptionResult(opt, 0, "", violations, None, _no_single(), w, 0.0, 0.0, card_tier, caps, fg)
    single = single_user(p, opt)
    n_cap = min(list(caps.values()) + [max_sessions])
    n_best, limit, fig = 0, "", None
    if n_cap >= 1 and not violations:
        n = np.arange(1, n_cap + 1, dtype=float)
        steps = step_times(p, opt, n)["step"]
        ok = np.nonzero(steps <= p.slo_s * (1 + 1e-12))[0]
        if len(ok) == 0:
            violations["slo"] = (f"one session per card already takes {steps[0] * 1e3:.2f} ms per step, "
                                 f"over the {p.slo_s * 1e3:g} ms per token target")
        else:
            n_best = int(ok[-1]) + 1
            limit = "slo" if n_best < n_cap else min((c for c in caps if caps[c] == n_cap), default="slo")
            fig = figures(p, opt, n_best)
    pool_bytes = pool_tables + (n_best * S * k if opt.kv == "pool" else 0.0)
    host_total = host_per_server + (n_best * hw.server_cards * k if opt.kv == "host" else 0.0)
    return OptionResult(opt, n_best, limit, violations, fig, single, w, host_total, pool_bytes, card_tier, caps,
                        fg)


def _no_single() -> SingleUser:
    nan = float("nan")
    return SingleUser(nan, nan, nan, nan, nan, nan, nan, nan, {})


def evaluate_all(p: Problem, deadline: float | None = None) -> list[OptionResult]:
    """Evaluate every option of the instance (see :func:`options`); with ``deadline``
    (``time.perf_counter()`` seconds) the options left when it passes are not evaluated (at least
    one is): compare the length with ``len(options(p))`` to know how many were left out."""
    import time

    out = []
    for o in options(p):
        if out and deadline is not None and time.perf_counter() >= deadline:
            break
        out.append(evaluate_option(p, o))
    return out
