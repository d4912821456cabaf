"""Independent re-check of a supernode plan.

Re-derives every figure of each built instance from the inventory and the hardware with plain
scalar arithmetic (no numpy, no shared code with :mod:`optimizer.supernode.perf` beyond the
resolved problem) and checks the limits: cards, HBM per card (eq 6-1/6-14), host memory per
server, ROM/SRAM per card, the memory pool, the per-token target, the sessions target. The
solver's objective is recomputed from these figures. With ``supernode.expert_load`` the cards'
shares of the routed tokens are re-derived from the trace's fractions by interval overlap and
the All-to-All's busiest link by closed forms per topology (:func:`_torus_skew`, :func:`_switched_skew`,
:func:`cross_server_skew`), not by the
fabric model's routing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from optimizer.supernode.plan import SupernodePlan
from optimizer.supernode.schema import Problem


@dataclass(frozen=True)
class InstanceCheck:
    """Figures of one built option, recomputed (SI units)."""

    label: str
    size: int
    count: int
    sessions_per_card: int
    weights_per_card: float
    hbm_used: float
    step: float
    tokens_per_s_card: float
    single_user: float


@dataclass(frozen=True)
class Evaluation:
    instances: list[InstanceCheck]
    cards_used: int
    sessions: int
    tokens_per_s: float
    tokens_per_s_per_card: float
    violations: list[str] = field(default_factory=list)
    cost_usd: float | None = None  # cards + fabrics (with a supernode.fabric section), USD
    fabric_power_w: float = 0.0
    switch_chips: int = 0
    port_links: int = 0


def _ring_share(n: int, forward: bool) -> float:
    """Sum over ring offsets of the hops one direction takes (shorter way, a tie split in half)."""
    total = 0.0
    for d in range(1, n):
        fwd, back = d, n - d
        total += fwd if fwd < back else (fwd / 2 if fwd == back else 0.0)
    return total


def card_shares(load, cards: int) -> list[list[float]]:
    """Each card's share of the routed tokens per layer: expert e holds ``[e S, (e+1) S)`` and
    card d ``[d E, (d+1) E)`` in units of ``1 / (E S)``; card d takes ``f_e x overlap / S``."""
    E, S = load.experts, cards
    out = []
    for fr in load.fractions:
        row = [0.0] * S
        for e, fe in enumerate(fr):
            lo, hi = e * S, (e + 1) * S
            d = lo // E
            while d < S and d * E < hi:
                row[d] += fe * (min(hi, (d + 1) * E) - max(lo, d * E)) / S
                d += 1
        out.append(row)
    return out


@lru_cache(maxsize=64)
def _ring_tables(n: int) -> tuple[list[float], list[float]]:
    """``g[t]``: the part of the flows to a card t steps ahead of a ring edge that use it (over
    every source behind it); ``h[a]``: of the flows from a card a steps behind it (over every
    destination ahead), shortest way with a tie split in half."""
    def frac(length: int) -> float:
        return 1.0 if length < n - length else (0.5 if length == n - length else 0.0)

    g = [0.0] + [sum(frac(a + t) for a in range(n - t)) for t in range(1, n)]
    h = [sum(frac(a + t) for t in range(1, n - a)) for a in range(n)]
    return g, h


def _torus_skew(dims: list[int], sh: list[float]) -> tuple[float, float]:
    """Busiest directed link's bytes of the dispatch and of the combine (card d takes ``sh[d]``
    of every other card's 1 byte of tokens) on a torus, dimension-ordered, C-order card index.

    Along dimension k a flow s -> d sits at d's coordinates below k and s's above k, so edge
    ``c_k -> c_k ± 1`` of the line at (prefix ``c_<k``, suffix ``c_>k``) carries, in the dispatch,
    ``P_<k x sum_j W[c_<k][j] g(±(j - c_k))`` (W: the shares of the cards with that prefix and
    coordinate j; every source prefix counts, ``P_<k`` of them) and in the combine
    ``P_>k x sum_i V[i][c_>k] h(±(c_k - i))``."""
    C = len(sh)
    disp = comb = 0.0
    for k, n in enumerate(dims):
        below = 1
        for m in dims[:k]:
            below *= m
        above = C // (below * n)
        g, h = _ring_tables(n)
        W = [[0.0] * n for _ in range(below)]
        V = [[0.0] * above for _ in range(n)]
        for d, x in enumerate(sh):
            pre, rest = divmod(d, n * above)
            j, suf = divmod(rest, above)
            W[pre][j] += x
            V[j][suf] += x
        for sign in (1, -1):
            for c in range(n):
                for pre in range(below):
                    disp = max(disp, below * sum(W[pre][j] * g[(sign * (j - c)) % n] for j in range(n)))
                for suf in range(above):
                    comb = max(comb, above * sum(V[i][suf] * h[(sign * (c - i)) % n] for i in range(n)))
    return disp, comb


def _switched_skew(size: int, ports: int, down: int | None, up: int | None, sh: list[float]) -> float:
    """Busiest link's bytes (dispatch; the combine, its transpose, has the same maximum) when
    card d takes ``sh[d]`` of every other card's 1 byte of tokens: a card port
    ``max((1 - sh_s) / P, (C - 1) sh_d / P)``, a leaf of m cards holding share ``L`` up
    ``m (1 - L) / (up P)`` and down ``(C - m) L / (up P)``."""
    C = size
    worst = max(max(1.0 - x for x in sh), (C - 1) * max(sh)) / ports
    if down is not None and -(-C // down) > 1:
        for start in range(0, C, down):
            m = min(down, C - start)
            L = sum(sh[start:start + m])
            worst = max(worst, max(m * (1.0 - L), (C - m) * L) / (up * ports))
    return worst


def cross_server_skew(p: Problem, size: int) -> list[tuple[float, float]]:
    """Per layer, the busiest card's NVLink and NIC bytes per byte of its tokens in a NIC-joined
    instance (servers of ``server_cards`` in card order): on each path the larger of what a card
    sends (the shares of the other cards of its server; of the other servers) and receives
    (its share x the senders on that path)."""
    s = p.hw.server_cards
    out = []
    for sh in card_shares(p.expert_load, size):
        srv = [sum(sh[i:i + s]) for i in range(0, size, s)]
        top = max(sh)
        nv = max(max(srv[c // s] - sh[c] for c in range(size)), top * (s - 1))
        nic = max(max(1.0 - srv[c // s] for c in range(size)), top * (size - s))
        out.append((nv, nic))
    return out


def fabric_check(p: Problem, cand, size: int) -> dict:
    """Closed forms for a candidate fabric of ``size`` cards, by scalar arithmetic (not the fabric
    model's routing): ports, links, switch chips, worst hops, the busiest directed link's seconds
    per byte leaving each card in a uniform All-to-All, connection state, cost and power.

    Torus (dimension-ordered, shortest way, translation invariant): every directed link of
    dimension k carries ``w x (C / n_k) x sum_d h(d)`` for w bytes to each peer; switched: a card
    port ``B / P``, a leaf uplink ``m (C - m) / (C - 1) x B / (up x P)`` for a leaf of m cards.
    """
    fs = p.fabric
    hosts = max(1, -(-size // p.hw.server_cards))
    a = fs.endpoints_per_host
    state = 512 * a * a * (hosts - 1) + 32 * a if cand.organisation == "pairwise" else 52 * a + 56 * (hosts - 1)
    out = {"state_ok": state <= fs.cache_bytes, "buildable": True}
    if cand.kind == "torus":
        dims = list(cand.dims)
        bundle = fs.card_ports // (2 * len(dims)) if 2 * len(dims) <= fs.card_ports else 0
        if not bundle:
            return dict(out, buildable=False)
        bw = bundle * fs.port_bandwidth
        w = 1.0 / (size - 1)
        per_byte = max(w * (size / n) * _ring_share(n, True) for n in dims) / bw
        links = size * 2 * len(dims) // 2 * bundle
        chips, hops = 0, sum(n // 2 for n in dims)
        latency_chips = hops - 1
    else:
        ports = cand.ports_per_card or fs.card_ports
        bw = min(fs.port_bandwidth, fs.switch_bandwidth)
        if ports > fs.card_ports:
            return dict(out, buildable=False)
        per_byte = 1.0 / ports / bw
        if cand.levels == 1:
            if size > fs.switch_ports:
                return dict(out, buildable=False)
            chips = -(-ports // (fs.switch_ports // size))
            links, hops = ports * size, 2
        else:
            dn, up = cand.down_ports, cand.up_ports
            leaves = -(-size // dn)
            if dn + up > fs.switch_ports or leaves > fs.switch_ports:
                return dict(out, buildable=False)
            spines = -(-(leaves * up) // fs.switch_ports)
            chips = ports * (leaves + spines)
            links = ports * (size + leaves * up)
            hops = 4 if leaves > 1 else 2
            sizes = [min(dn, size - i * dn) for i in range(leaves)]
            if leaves > 1:
                per_byte = max(per_byte, max(m * (size - m) / (size - 1) for m in sizes) / (up * ports) / bw)
        latency_chips = hops - 1
    out["per_byte_uniform"] = per_byte
    if p.expert_load is not None:  # per byte a uniform exchange sends out, (S-1)/S of the tokens
        out_share = (size - 1) / size
        ks = []
        for sh in card_shares(p.expert_load, size):
            if cand.kind == "torus":
                disp, comb = _torus_skew(list(cand.dims), sh)
                ks.append((disp + comb) / 2 / bw / out_share)
            else:
                ks.append(_switched_skew(size, ports, cand.down_ports if cand.levels == 2 else None,
                                         cand.up_ports, sh) / bw / out_share)
        per_byte = sum(ks) / len(ks)
    cost = links * fs.link_cost_usd + chips * fs.switch_cost_usd + (
        fs.ub_cost_usd_per_host * hosts if cand.organisation == "endpoint+channel" else 0.0)
    return dict(out, per_byte=per_byte, latency=latency_chips * fs.hop_latency_s, links=links, chips=chips,
                hops=hops, cost=cost, power=links * fs.link_power_w + chips * fs.switch_power_w)


def _a2a(p: Problem, size: int, fabric: str, tokens: float, cand=None) -> float:
    hw, inv = p.hw, p.inventory
    if size <= 1 or inv.moe_layers == 0:
        return 0.0
    b = tokens * inv.dispatch_bytes_per_token
    if cand is not None:
        f = fabric_check(p, cand, size)
        return hw.nvlink_latency_s + f["latency"] + b * (size - 1) / size * f["per_byte"]
    skew = p.expert_load
    if fabric == "scale_up":
        if skew is None:
            return hw.nvlink_latency_s + b * (size - 1) / size / hw.nvlink_bandwidth
        rows = card_shares(skew, size)
        frac = sum(max(1.0 - min(sh), (size - 1) * max(sh)) for sh in rows) / len(rows)
        return hw.nvlink_latency_s + b * frac / hw.nvlink_bandwidth
    s = min(size, hw.server_cards)
    if skew is None:
        return max(hw.nvlink_latency_s + b * (s - 1) / size / hw.nvlink_bandwidth,
                   hw.nic_latency_s + b * (size - s) / size / hw.nic_bandwidth)
    per = [max(hw.nvlink_latency_s + b * nv / hw.nvlink_bandwidth, hw.nic_latency_s + b * nic / hw.nic_bandwidth)
           for nv, nic in cross_server_skew(p, size)]
    return sum(per) / len(per)


def _fetch_excess(p: Problem, tables: tuple[str, ...], n: float, base: float) -> float:
    hw, inv = p.hw, p.inventory
    worst = 0.0
    for tier_name in set(tables) - {"hbm"}:
        tabs = [t for t, tn in zip(inv.tables, tables) if tn == tier_name]
        tier = hw.tiers[tier_name]
        rows = n * sum(t.rows_per_token for t in tabs)
        nbytes = n * sum(t.rows_per_token * t.row_bytes for t in tabs)
        if tier_name == "host":
            fetch = tier.latency_s + max(rows * hw.server_cards / tier.reads_per_s, nbytes / tier.bandwidth)
        elif tier_name == "pool":
            q = tier.transaction_bytes
            fetch = tier.latency_s + n * sum(t.rows_per_token * math.ceil(t.row_bytes / q) * q for t in tabs) / tier.bandwidth
        else:
            fetch = tier.latency_s + nbytes / tier.bandwidth
        window = min(t.layer for t in tabs) * base / inv.layers
        worst = max(worst, fetch - window)
    return worst


def evaluate(p: Problem, plan: SupernodePlan) -> Evaluation:
    """Re-check a plan.

    Args:
        p: the resolved problem.
        plan: the built options (size, fabric, table tiers, KV tier of each option; sessions per
            card; instances).
    Returns:
        The recomputed figures and a list of violated limits (empty for a valid plan).
    """
    hw, inv = p.hw, p.inventory
    ctx = p.context_tokens
    extra = inv.table_extra_bytes / inv.table_bytes if inv.table_bytes else 0.0
    k = inv.kv_capacity_bytes.fixed + inv.kv_capacity_bytes.per_context_token * ctx
    kv_read = inv.kv_read_bytes.fixed + inv.kv_read_bytes.per_context_token * ctx
    flop = inv.flops_per_token.fixed + inv.flops_per_token.per_context_token * ctx
    out, bad = [], []
    cards = sessions = 0
    tps = 0.0
    pool_used = 0.0
    cost = power = 0.0
    chips = links = 0
    fabrics_used = set()
    for built in plan.instances:
        o, n, count = built.option, built.sessions_per_card, built.count
        size, fabric, tables, kv = o.size, o.fabric, o.tables, o.kv
        label = f"S={size} {fabric} tables {','.join(tables)} KV {kv}"
        cand = None
        if o.candidate is not None:
            cand = p.fabric.candidates[o.candidate]
            fabrics_used.add(o.candidate)
            fc = fabric_check(p, cand, size)
            if not fc["buildable"]:
                bad.append(f"{label}: fabric {cand.label} cannot be built for {size} cards")
                continue
            if not fc["state_ok"]:
                bad.append(f"{label}: {cand.organisation} connection state exceeds the NIC cache")
            cost += count * fc["cost"]
            power += count * fc["power"]
            chips += count * fc["chips"]
            links += count * fc["links"]
        if p.fabric is not None:
            cost += count * size * p.fabric.card_cost_usd
        cards += size * count
        sessions += size * n * count
        tab_in = lambda tier: sum(t.bytes * (1 + extra) for t, tn in zip(inv.tables, tables) if tn == tier)
        w = inv.replicated_resident_bytes + (inv.routed_bytes + tab_in("hbm")) / size
        used = w + p.reserve_bytes + (n * k if kv == "hbm" else 0.0)
        if used > hw.memory_bytes * (1 + 1e-12):
            bad.append(f"{label}: HBM {used / 1e9:.3f} GB per card > {hw.memory_bytes / 1e9:g} GB")
        if n < 1:
            bad.append(f"{label}: no session fits")
        host = tab_in("host") * hw.server_cards / size + (n * hw.server_cards * k if kv == "host" else 0.0)
        if host > 0 and host > hw.tiers["host"].capacity_bytes * (1 + 1e-12):
            bad.append(f"{label}: host memory {host / 1e9:.1f} GB per server over capacity")
        for tier in ("rom", "sram"):
            b = tab_in(tier) / size
            if b > 0 and b > hw.tiers[tier].capacity_bytes * (1 + 1e-12):
                bad.append(f"{label}: {tier} {b / 1e9:.3f} GB per card over capacity")
        pool_used += count * (tab_in("pool") + (n * size * k if kv == "pool" else 0.0))
        # decode step for n sessions per card
        e, kk = inv.routed_experts, inv.experts_per_token
        touched = inv.moe_layers * (e / size) * (1 - (1 - kk / e) ** (n * size)) * inv.expert_bytes if e else 0.0
        lookups = n * sum(t.rows_per_token * t.row_bytes for t, tn in zip(inv.tables, tables) if tn == "hbm")
        reads = inv.replicated_read_bytes + touched + lookups + (n * kv_read if kv == "hbm" else 0.0)
        kv_bw = hw.hbm_bandwidth if kv == "hbm" else hw.tiers[kv].bandwidth
        t_kv = 0.0 if kv == "hbm" else n * kv_read / kv_bw
        base = max(reads / hw.hbm_bandwidth, t_kv, n * flop / hw.flops) \
            + 2 * inv.moe_layers * _a2a(p, size, fabric, n, cand) + p.fixed_s
        step = base + max(0.0, _fetch_excess(p, tables, n, base))
        if step > p.slo_s * (1 + 1e-9):
            bad.append(f"{label}: step {step * 1e3:.3f} ms > {p.slo_s * 1e3:g} ms per token")
        # eq 6-15
        t_w = (inv.replicated_read_bytes + lookups / max(n, 1)) / hw.hbm_bandwidth
        b1 = max(t_w, kv_read / kv_bw, flop / hw.flops) / p.overlap_efficiency \
            + p.single_user_a2a * inv.moe_layers * _a2a(p, size, fabric, 1, cand) + p.fixed_s
        t1 = b1 + max(0.0, _fetch_excess(p, tables, 1, b1))
        tps += count * size * n / step
        out.append(InstanceCheck(label, size, count, n, w, used, step, n / step, t1))
    if cards > p.cards:
        bad.append(f"{cards} cards used > {p.cards} given")
    if pool_used > 0 and pool_used > hw.tiers["pool"].capacity_bytes * (1 + 1e-12):
        bad.append(f"pool {pool_used / 1e9:.1f} GB over capacity")
    if p.target_sessions is not None and sessions < p.target_sessions:
        bad.append(f"{sessions} sessions < target {p.target_sessions}")
    if not plan.instances:
        bad.append("no instance built")
    if len(fabrics_used) > 1:
        bad.append(f"{len(fabrics_used)} different fabrics built, one allowed")
    fs = p.fabric
    if fs is not None and fs.max_power_w is not None and power > fs.max_power_w * (1 + 1e-9):
        bad.append(f"fabric power {power / 1e3:.2f} kW > {fs.max_power_w / 1e3:g} kW")
    if fs is not None and fs.max_switch_chips is not None and chips > fs.max_switch_chips:
        bad.append(f"{chips} switch chips > {fs.max_switch_chips}")
    return Evaluation(out, cards, sessions, tps, tps / p.cards, bad, None if fs is None else cost, power, chips, links)
