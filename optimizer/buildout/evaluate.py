"""An independent evaluator of a build-out plan (no solver, no model code).

Checks a plan against the problem's limits in the input units (kW, U, ports) and computes
the figures the report prints. Tests cross-check every solver plan with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil

from optimizer.buildout.plan import BuildoutPlan
from optimizer.buildout.schema import Problem

EPS_KW = 1e-6


@dataclass(frozen=True)
class Evaluation:
    """Figures of a plan and the limits it breaks (``violations`` empty when valid)."""

    gpus: int
    power_kw: float
    second_tier: bool
    racks: dict[str, int]
    install_units: int
    leaves: int
    spine: int
    gpu_links: int
    uplinks: int
    violations: list[str] = field(default_factory=list)
    domains: int = 0


def power_kw(p: Problem, servers: dict[str, int], chips: int = 0) -> float:
    """Power drawn by a plan, kW: fixed load + servers + second tier if needed (eq. 6-11)
    + ``chips`` switch chips at ``fabric.switch_power_kw`` each."""
    gpus = sum(p.type(n).gpus * c for n, c in servers.items())
    kw = p.fixed_power_kw + sum(p.type(n).power_kw * c for n, c in servers.items())
    if p.fabric is not None:
        if gpus > p.fabric.one_tier_max_gpus:
            kw += p.fabric.second_tier_power_kw
        kw += chips * p.fabric.switch_power_kw
    return kw


def rack_limit_kw(p: Problem, cooling: str) -> float | None:
    """A rack's power limit, kW: its cooling limit, or the usable feed power when lower
    (``feed_kw x max_utilization x feeds``, half the feeds with A+B redundancy). None when
    that cooling is not available."""
    lim = {"air": p.air_cooled_kw, "liquid": p.liquid_cooled_kw}.get(cooling)
    if lim is None or p.feed_kw is None:
        return lim
    feeds = p.feeds_per_rack / 2 if p.redundant_feeds else p.feeds_per_rack
    return min(lim, p.feed_kw * p.max_utilization * feeds)


def evaluate(p: Problem, plan: BuildoutPlan) -> Evaluation:
    """Evaluate a plan against the problem's limits, in input units (kW, U, ports).

    Reads the plan's servers per type, its racks (cooling, servers and switch chips per rack,
    number of such racks), its leaf chips (downlinks, uplinks, count) and spine chips.
    Returns the figures and the limits broken (``violations``, empty for a valid plan).
    """
    servers, spine = plan.servers, plan.spine
    leaves = [(g.downlinks, g.uplinks, g.count) for g in plan.leaves]
    racks = [(g.pattern.cooling, g.servers(p.types), g.count, g.switch_chips(p.types)) for g in plan.racks]
    v: list[str] = []
    gpus = sum(p.type(n).gpus * c for n, c in servers.items())
    chips = sum(c for _d, _u, c in leaves or []) + spine
    kw = power_kw(p, servers, chips)
    if p.domains is not None:
        kw += plan.domains * p.domains.power_kw
        if plan.domains * p.domains.cards < gpus:
            v.append(f"{plan.domains} scale-up domains of {p.domains.cards} cards hold fewer than {gpus} GPUs")
    elif plan.domains:
        v.append("scale-up domains without a scale_up_domains section")
    if kw > p.power_budget_kw + EPS_KW:
        v.append(f"power {kw:.3f} kW > budget {p.power_budget_kw} kW")
    u = p.install_unit_servers
    for n, c in servers.items():
        t = p.type(n)
        if c % u:
            v.append(f"{n}: {c} servers is not a multiple of the install unit {u}")
        if t.max_count is not None and c > t.max_count:
            v.append(f"{n}: {c} servers > max_count {t.max_count}")
    if p.target_gpus is not None and gpus < p.target_gpus:
        v.append(f"{gpus} GPUs < target {p.target_gpus}")
    placed = {n: 0 for n in servers}
    count = {"air": 0, "liquid": 0}
    racked_chips = 0
    sw_kw = p.fabric.switch_power_kw if p.fabric is not None else 0.0
    sw_u = p.fabric.switch_rack_units if p.fabric is not None else 0
    for cooling, content, mult, sw in racks:
        lim = rack_limit_kw(p, cooling)
        if lim is None:
            v.append(f"{cooling} cooling is not available")
            continue
        rk = sum(p.type(n).power_kw * c for n, c in content.items()) + sw * sw_kw
        ru = sum(p.type(n).rack_units * c for n, c in content.items()) + sw * sw_u
        if rk > lim + EPS_KW:
            v.append(f"{cooling} rack draws {rk:.3f} kW > {lim:g} kW")
        if ru > p.rack_units:
            v.append(f"{cooling} rack holds {ru}U > {p.rack_units}U")
        count[cooling] += mult
        racked_chips += sw * mult
        for n, c in content.items():
            placed[n] = placed.get(n, 0) + c * mult
    for n, c in servers.items():
        if placed.get(n, 0) < c:
            v.append(f"{n}: only {placed.get(n, 0)} of {c} servers have a rack")
        elif placed.get(n, 0) > c:
            v.append(f"{n}: the racks hold {placed.get(n, 0)} servers but the plan has {c}")
    if p.fabric is not None and (sw_kw > 0 or sw_u > 0) and racked_chips != chips:
        v.append(f"the racks hold {racked_chips} switch chips but the fabric has {chips}")
    elif racked_chips and not (sw_kw > 0 or sw_u > 0):
        v.append(f"the racks hold {racked_chips} switch chips but switches are not racked")
    tier2 = p.fabric is not None and gpus > p.fabric.one_tier_max_gpus
    n_leaves = links = ups = 0
    if p.fabric is not None:
        f = p.fabric
        links = f.gpu_links * gpus
        down_cap = 0
        for d, up, mult in leaves or []:
            n_leaves += mult
            ups += up * mult
            down_cap += d * mult
            if d + up > f.switch_radix:
                v.append(f"leaf split {d}+{up} ports > radix {f.switch_radix}")
            if up > 0 and d > f.max_oversubscription * up:
                v.append(f"leaf {d} down / {up} up exceeds oversubscription {float(f.max_oversubscription):g}")
            if tier2 and up == 0:
                v.append("a two-tier leaf needs uplinks")
        if down_cap < links:
            v.append(f"leaf downlink ports {down_cap} < GPU links {links}")
        if spine * f.switch_radix < ups:
            v.append(f"spine ports {spine * f.switch_radix} < leaf uplinks {ups}")
        if not tier2 and (ups or spine):
            v.append("a one-tier fabric has no spine")
    n_units = sum(ceil(c / u) for c in servers.values())
    return Evaluation(gpus, round(kw, 6), tier2, count, n_units, n_leaves, spine, links, ups, v, plan.domains)
