"""Fabric topology and collectives timed by the busiest directed link (optimizer/model/fabric.py):
the reference chapter's figures of sections 6.5.1-6.5.4, each at print precision, plus the checks
that make them more than arithmetic (routing against scipy's shortest paths, byte conservation,
Swing as a valid butterfly) and that the scale_up/scale_out pair stays the simple case."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import shortest_path

from optimizer.errors import InputError
from optimizer.model.collectives import ring_allreduce_s, tree_allreduce_s
from optimizer.model.fabric import (
    FabricIn, NumaHost, Switched, Torus, alltoall_time, collective_time, fabric_entry, hierarchical_rounds,
    load_fabric_catalog, moe_dispatch_combine_time, moe_link_loads, moe_traffic, recursive_rounds, ring_rounds,
    schedule_link_bytes, skewed_alltoall, swing_rho, swing_rounds, time_round, time_schedule, torus_ring_rounds, uniform_alltoall,
)
from optimizer.model.hardware import hardware_from_catalog

MiB = 2 ** 20
# the chapter's worked constants
RING_CARDS, RS_BYTES, RING_LINK_GB_S = 16, 8 * MiB, 50


def _chapter_hop_latency_s() -> float:
    return fabric_entry("hop_latency", "chapter-6.5")["hop_latency_ns"] * 1e-9


# ------------------------------------------------------------------ 16 cards on a bidirectional ring

@pytest.mark.parametrize("schedule,hops,busiest_mib,total_us", [
    (recursive_rounds, [1, 2, 4], [4, 4, 4], 252),
    (swing_rounds, [1, 1, 3], [4, 2, 2], 168),
])
def test_first_three_reduce_scatter_rounds_on_a_16_card_ring(schedule, hops, busiest_mib, total_us):
    """8 MiB ReduceScatter: both send 4, 2, 1 MiB; recursive halving over 1, 2, 4 hops with
    4, 4, 4 MiB on the busiest directed link, Swing over 1, 1, 3 with 4, 2, 2; at 50 GB/s the
    three rounds take about 252 vs 168 us (bandwidth term: 12 MiB / 50 GB/s = 251.7 us)."""
    ring = Torus((RING_CARDS,), RING_LINK_GB_S * 1e9)
    rounds = schedule(RING_CARDS, RS_BYTES, "reduce_scatter")[:3]
    assert [set(r.nbytes / MiB) for r in rounds] == [{4}, {2}, {1}]
    timed = [time_round(ring, r) for r in rounds]
    assert [t.max_hops for t in timed] == hops
    assert [set(ring.hops(r.src, r.dst)) for r in rounds] == [{h} for h in hops]  # every rank, not only the worst
    assert [round(t.bytes_on_busiest_link / MiB, 6) for t in timed] == busiest_mib
    total = sum(t.time_s for t in timed)
    assert round(total * 1e6) == total_us
    assert total == pytest.approx(sum(busiest_mib) * MiB / (RING_LINK_GB_S * 1e9), rel=1e-12)


def test_start_up_and_chip_latency_add_per_round():
    """With alpha and a hop latency the rounds add ``alpha + chips x hop`` each to the bandwidth
    term (recursive's round 2 passes 3 intermediate routers, Swing's 2)."""
    hop, alpha = _chapter_hop_latency_s(), 1e-6
    ring = Torus((RING_CARDS,), RING_LINK_GB_S * 1e9, hop, alpha)
    bare = Torus((RING_CARDS,), RING_LINK_GB_S * 1e9)
    for schedule, chips in ((recursive_rounds, [0, 1, 3]), (swing_rounds, [0, 0, 2])):
        rounds = schedule(RING_CARDS, RS_BYTES, "reduce_scatter")[:3]
        got = time_schedule(ring, rounds).time_s - time_schedule(bare, rounds).time_s
        assert got == pytest.approx(3 * alpha + sum(chips) * hop, rel=1e-9)


def test_swing_peers_are_a_butterfly():
    """rho = 1, -1, 3, -5, 11; every round pairs ranks both ways, and after log2 p rounds each
    rank has combined every rank's data exactly once (the reach doubles without overlap)."""
    assert [swing_rho(s) for s in range(5)] == [1, -1, 3, -5, 11]
    for p in (4, 16, 64):
        reach = [{r} for r in range(p)]
        for rnd in swing_rounds(p, 1.0, "reduce_scatter"):
            peer = dict(zip(rnd.src.tolist(), rnd.dst.tolist()))
            assert all(peer[peer[r]] == r for r in range(p))
            assert all(not (reach[r] & reach[peer[r]]) for r in range(p))
            reach = [reach[r] | reach[peer[r]] for r in range(p)]
        assert all(len(x) == p for x in reach)


@pytest.mark.parametrize("schedule", [recursive_rounds, swing_rounds])
def test_reduce_scatter_sends_what_a_ring_sends(schedule):
    """Each rank sends ``M (p-1)/p`` in a ReduceScatter, whatever the algorithm."""
    p, m = 32, 3.0 * MiB
    ring = sum(r.nbytes[0] * r.repeat for r in ring_rounds(list(range(p)), m, "reduce_scatter"))
    halving = sum(r.nbytes[0] for r in schedule(p, m, "reduce_scatter"))
    assert halving == pytest.approx(ring) == pytest.approx(m * (p - 1) / p)


# ------------------------------------------------------------------ 64 cards: torus vs switched

def _torus64() -> Torus:
    return Torus((4, 4, 4), 50e9, _chapter_hop_latency_s())


def _switched64() -> Switched:
    return Switched(64, 6, 64, 50e9, _chapter_hop_latency_s())


def test_64_cards_links_and_switch_chips():
    """4x4x4 torus, 6 ports per card: 64 x 6 / 2 = 192 links, no switch chip; switched (6 ports
    per card, 64-port chips): 384 links and six chips."""
    t, s = _torus64(), _switched64()
    assert (t.ports_per_card, t.links, t.switch_chips) == (6, 192, 0)
    assert (s.links, s.switch_chips) == (384, 6)


def test_64_cards_farthest_pair_and_the_latency_it_costs():
    """Farthest pair: 6 hops and 5 intermediate chips on the torus, 2 links and 1 switch chip
    when switched: +0.8 us per transfer at 200 ns per chip."""
    t, s = _torus64(), _switched64()
    src, dst = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    assert (t.describe()["max_hops"], t.describe()["max_chips"]) == (6, 5)
    assert (int(s.hops(src, dst).max()), int(s.chips(src, dst).max())) == (2, 1)
    extra = (t.chips(src, dst).max() * t.hop_latency_s - s.chips(src, dst).max() * s.hop_latency_s)
    assert round(extra * 1e6, 1) == 0.8


def test_uniform_alltoall_averages_3_hops_on_the_torus():
    """Mean over the 63 other cards: 192/63 = 3.05, 'averages 3 hops'."""
    assert round(_torus64().mean_hops()) == 3
    assert _torus64().mean_hops() == pytest.approx(192 / 63)


def test_dimension_ordered_allreduce_uses_every_port_on_both():
    t, s = _torus64(), _switched64()
    rounds = torus_ring_rounds(t, 64 * MiB)
    for top in (t, s):
        ports = sum(top.port_loads(r.src, r.dst, r.nbytes) for r in rounds)
        assert ports.shape == (64, 6, 2) and (ports > 0).all()
    # a plain ring on the torus does not: it leaves ports idle
    ring = ring_rounds(list(range(64)), 64 * MiB)
    assert not (sum(t.port_loads(r.src, r.dst, r.nbytes) for r in ring) > 0).all()


@pytest.mark.parametrize("dims", [(16,), (4, 4, 4), (2, 3, 4), (8, 8)])
def test_torus_hops_are_shortest_paths(dims):
    """Dimension-ordered routing is minimal on a torus: hops equal scipy's shortest paths on the
    card graph, and every flow's bytes sit on exactly ``hops`` directed links."""
    t = Torus(dims, 1e9)
    c = np.arange(t.cards)
    rows = np.concatenate([c for k in range(len(dims)) for _ in (0, 1)])
    cols = np.concatenate([t.neighbour(c, k, sgn) for k in range(len(dims)) for sgn in (+1, -1)])
    graph = coo_matrix((np.ones(rows.size), (rows, cols)), shape=(t.cards, t.cards)).tocsr()
    dist = shortest_path(graph, unweighted=True)
    src, dst = np.meshgrid(c, c, indexing="ij")
    assert np.array_equal(t.hops(src, dst), dist.astype(int))
    rng = np.random.default_rng(0)
    s, d = rng.integers(0, t.cards, 200), rng.integers(0, t.cards, 200)
    b = rng.uniform(1, 10, 200)
    assert t.link_loads(s, d, b).sum() == pytest.approx((b * t.hops(s, d)).sum())


# ------------------------------------------------------------------ leaf down/up split

@pytest.mark.parametrize("down,up,uplink_gb_s", [(32, 32, 800), (48, 16, 400)])
def test_nvswitch_leaf_uplink(down, up, uplink_gb_s):
    """One 64-port NVSwitch chip (25 GB/s per port per direction) as a leaf: 32 down / 32 up
    gives 800 GB/s of uplink, 48 / 16 only 400 GB/s."""
    chip = fabric_entry("switch_chips", "nvswitch-gen3")
    f = FabricIn(kind="switched", cards=4 * down, ports_per_card=1, switch="nvswitch-gen3", levels=2,
                 down_ports=down, up_ports=up).build()
    assert (f.switch_ports, f.link_bandwidth_bytes_per_s) == (chip["ports"], chip["port_bandwidth_gb_s"] * 1e9)
    assert f.leaf_uplink_bandwidth_bytes_per_s / 1e9 == pytest.approx(uplink_gb_s)


def test_an_oversubscribed_leaf_binds_a_uniform_alltoall():
    """All-to-All over 4 leaves: at 32/32 the card port binds, at 48/16 the leaf uplink (3:1)."""
    def a2a(down, up):
        f = Switched(4 * down, 1, 64, 25e9, levels=2, down_ports=down, up_ports=up)
        return alltoall_time(f, uniform_alltoall(f.cards, 1e6)).binding()
    assert a2a(32, 32).busiest_link.startswith("card")
    slow = a2a(48, 16)
    assert slow.busiest_link.startswith("leaf")
    # 48 cards x 1 MB x 144/191 leave the leaf over 16 links of 25 GB/s
    assert slow.bandwidth_s == pytest.approx(48 * 1e6 * 144 / 191 / 16 / 25e9)


def test_two_level_counts():
    f = Switched(128, 2, 64, 25e9, levels=2, down_ports=48, up_ports=16)
    assert (f.leaves, f.spines) == (3, 1)
    assert f.switch_chips == 2 * (3 + 1) and f.links == 2 * (128 + 3 * 16)
    src, dst = np.meshgrid(np.arange(128), np.arange(128), indexing="ij")
    assert set(np.unique(f.hops(src, dst))) == {0, 2, 4} and f.max_hops() == 4


# ------------------------------------------------------------------ NUMA staging

@pytest.mark.parametrize("buffer,order,per_direction_mib", [
    (0, [0, 1, 2, 3], 24),  # every buffer on node A
    ("sender", [0, 1, 2, 3], 12),  # buffers near the sender, same-node cards adjacent
    ("sender", [0, 2, 1, 3], 24),  # near the sender but the ring alternates nodes
])
def test_numa_staging_of_a_ring_reduction(buffer, order, per_direction_mib):
    """Four cards on two NUMA nodes, ring reduction of 48 MiB in all (an 8 MiB ring AllReduce:
    12 MiB over each of the 4 ring edges): 24 MiB per direction across the CPUs with all
    buffers on node A, 12 MiB with buffers near the sender and same-node cards adjacent."""
    host = NumaHost((0, 0, 1, 1), 64e9, 50e9, buffer)
    rounds = ring_rounds(order, 8 * MiB, "allreduce")
    loads = schedule_link_bytes(host, rounds)
    assert loads[:4].sum() / MiB == pytest.approx(48)  # the ring's bytes in all, out of the cards
    cross = host.socket_bytes(loads) / MiB
    assert cross[0, 1] == pytest.approx(per_direction_mib) and cross[1, 0] == pytest.approx(per_direction_mib)


# ------------------------------------------------------------------ the scale_up / scale_out pair

@pytest.mark.parametrize("tier", ["scale_up", "scale_out"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_the_link_pair_is_the_simple_case(tier, p):
    """A tier of ``hardware_from_catalog`` as a one-level switched fabric: ring = eq. 6-9,
    tree = eq. 6-10, uniform All-to-All = ``Hardware.alltoall_s`` (inside a server)."""
    hw = hardware_from_catalog("h100-sxm", "hgx-h100")
    link = getattr(hw.server, tier)
    f = Switched.from_link(link, p)
    for m in (2.0 * 5120, 1e6, 64 * MiB):
        ring = collective_time(f, "ring", "allreduce", m).time_s
        assert ring == pytest.approx(ring_allreduce_s(p, m, link.alpha_s, link.bandwidth_bytes_per_s), rel=1e-12)
        tree = collective_time(f, "tree", "allreduce", m).time_s
        assert tree == pytest.approx(tree_allreduce_s(p, m, link.alpha_s, link.bandwidth_bytes_per_s), rel=1e-12)
        if tier == "scale_up":
            a2a = alltoall_time(f, uniform_alltoall(p, m)).time_s
            assert a2a == pytest.approx(hw.alltoall_s(p, m), rel=1e-12)


def test_hierarchical_keeps_the_ring_bytes_with_fewer_start_ups():
    """On one flat switch a hierarchical AllReduce (8 domains of 8) moves the flat ring's
    ``2(p-1)/p M`` per card but starts ``2(g-1) + 2(p/g-1)`` = 28 rounds instead of 126."""
    p, g, m, alpha = 64, 8, 8 * MiB, 2e-6
    f = Switched(p, 1, 64, 50e9, 0.0, alpha)
    h = collective_time(f, "hierarchical", "allreduce", m, domain_cards=g)
    ring = collective_time(f, "ring", "allreduce", m)
    assert h.bandwidth_s == pytest.approx(ring.bandwidth_s) == pytest.approx(2 * (p - 1) / p * m / 50e9)
    assert h.latency_s == pytest.approx(28 * alpha) and ring.latency_s == pytest.approx(126 * alpha)
    with pytest.raises(ValueError, match="do not divide"):
        hierarchical_rounds(p, 7, m)


def test_hierarchical_on_two_levels_keeps_the_inter_domain_part_on_the_uplinks():
    """Domains = leaves: only the inter-domain AllReduce (M/g per card) crosses the uplinks."""
    f = Switched(128, 1, 64, 25e9, levels=2, down_ports=32, up_ports=32)
    rounds = hierarchical_rounds(128, 32, 32 * MiB)
    loads = schedule_link_bytes(f, rounds)
    leaf_up = loads[2 * 128:2 * 128 + 4] * 32  # a leaf's 32 uplinks in all
    assert leaf_up == pytest.approx(np.full(4, 32 * 2 * 3 / 4 * 32 * MiB / 32))


# ------------------------------------------------------------------ All-to-All, MoE

def test_skewed_alltoall_loads_the_hot_card():
    """A card whose experts take 4x the tokens: dispatch binds on a link into it, combine on a
    link out of it, and the pair takes longer than the uniform one; a uniform share is the
    uniform All-to-All."""
    t = _torus64()
    share = np.ones(64)
    assert np.allclose(skewed_alltoall(1e6, share), uniform_alltoall(64, 1e6))
    share[0] = 4
    skewed = moe_dispatch_combine_time(t, 1e6, share)
    uniform = moe_dispatch_combine_time(t, 1e6)
    assert skewed.time_s > uniform.time_s
    into, out = skewed.rounds[0].busiest_link, skewed.rounds[1].busiest_link
    assert into.endswith(")") and "-> card 0 " in into and out.startswith("card 0 ->")


def test_uniform_alltoall_on_the_torus_loads_every_link_alike():
    """64 cards each sending 1 MB over the 4x4x4 torus: bytes x hops of all flows over the 384
    directed links is the mean load (32 flows' worth per link); dimension-ordered routing with
    the tie split half each way puts exactly that on every link."""
    t = _torus64()
    traffic = uniform_alltoall(64, 1e6)
    s, d = np.nonzero(traffic)
    mean = (traffic[s, d] * t.hops(s, d)).sum() / t.directed_links
    assert mean == pytest.approx(32 * 1e6 / 63)
    assert np.allclose(t.link_loads(s, d, traffic[s, d]), mean)
    assert alltoall_time(t, traffic).rounds[0].bytes_on_busiest_link == pytest.approx(mean)


# ------------------------------------------------------------------ the fabric: key

def test_fabric_key_builds_both_kinds():
    t = FabricIn(kind="torus", cards=64, dims=[4, 4, 4], link_bandwidth_gb_s=50, hop_latency_ns=200).build()
    assert isinstance(t, Torus) and t.hop_latency_s == pytest.approx(200e-9) and t.links == 192
    s = FabricIn(kind="switched", cards=64, ports_per_card=6, switch_ports=64, link_bandwidth_gb_s=50,
                 startup_us=1).build()
    assert isinstance(s, Switched) and s.switch_chips == 6 and s.startup_s == pytest.approx(1e-6)


@pytest.mark.parametrize("raw,match", [
    ({"kind": "torus", "cards": 60, "dims": [4, 4, 4], "link_bandwidth_gb_s": 50}, "hold 64 cards"),
    ({"kind": "torus", "cards": 64, "dims": [4, 4, 4], "ports_per_card": 4, "link_bandwidth_gb_s": 50}, "6 ports"),
    ({"kind": "switched", "cards": 8, "switch_ports": 64, "link_bandwidth_gb_s": 50}, "ports_per_card"),
    ({"kind": "switched", "cards": 8, "ports_per_card": 1, "switch_ports": 64, "levels": 2,
      "link_bandwidth_gb_s": 50}, "down_ports"),
    ({"kind": "torus", "cards": 8, "dims": [8], "switch": "nvswitch-gen3"}, "no switch chips"),
    ({"kind": "switched", "cards": 8, "ports_per_card": 1, "switch_ports": 64}, "link_bandwidth_gb_s"),
])
def test_fabric_key_refuses_inconsistent_descriptions(raw, match):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=match):
        FabricIn(**raw)


def test_fabric_key_refuses_what_the_ports_cannot_build():
    with pytest.raises(InputError, match="at most 64 cards"):
        FabricIn(kind="switched", cards=65, ports_per_card=1, switch="nvswitch-gen3").build()
    with pytest.raises(InputError, match="exceed the 64-port chip"):
        FabricIn(kind="switched", cards=128, ports_per_card=1, switch="nvswitch-gen3", levels=2,
                 down_ports=48, up_ports=32).build()
    with pytest.raises(InputError, match="unknown name 'nvswitch-9'"):
        FabricIn(kind="switched", cards=8, ports_per_card=1, switch="nvswitch-9").build()


def test_fabric_catalog_entries_have_sources():
    cat = load_fabric_catalog()
    for section in ("switch_chips", "hop_latency", "nics", "hosts"):
        assert cat[section] and all(e["source"] for e in cat[section].values())


def test_collective_time_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="power-of-two"):
        collective_time(Switched(12, 1, 64, 1e9), "swing", "allreduce", 1.0)
    with pytest.raises(ValueError, match="torus_ring runs on a Torus"):
        collective_time(Switched(8, 1, 64, 1e9), "torus_ring", "allreduce", 1.0)
    with pytest.raises(ValueError, match="unknown algorithm"):
        collective_time(Switched(8, 1, 64, 1e9), "butterfly", "allreduce", 1.0)


def test_allreduce_is_reduce_scatter_then_allgather():
    t = _torus64()
    for algo in ("ring", "recursive", "swing", "torus_ring"):
        ar = collective_time(t, algo, "allreduce", 4 * MiB).time_s
        parts = sum(collective_time(t, algo, op, 4 * MiB).time_s for op in ("reduce_scatter", "allgather"))
        assert ar == pytest.approx(parts)


def test_placement_moves_the_ranks():
    """The same ring on a torus, placed in dimension order vs scattered: the scattered ring's
    rounds cross more links and take longer."""
    t = _torus64()
    rng = np.random.default_rng(1)
    snake = collective_time(t, "ring", "allreduce", 4 * MiB)
    scattered = collective_time(t, "ring", "allreduce", 4 * MiB, cards=rng.permutation(64))
    assert scattered.time_s > snake.time_s
    assert max(r.max_hops for r in scattered.rounds) > max(r.max_hops for r in snake.rounds)


def test_every_pair_of_small_fabrics_agrees_on_counts():
    """hops / chips / links stay consistent for any small torus: chips = hops - 1 off the
    diagonal, links = cards x ports / 2."""
    for dims in itertools.product((2, 3, 4), repeat=2):
        t = Torus(dims, 1e9)
        src, dst = np.meshgrid(np.arange(t.cards), np.arange(t.cards), indexing="ij")
        off = src != dst
        assert np.array_equal(t.chips(src, dst)[off], t.hops(src, dst)[off] - 1)
        assert t.links == t.cards * t.ports_per_card // 2


# ------------------------------------------------------------------ MoE traffic under expert-load skew

def test_moe_traffic_keeps_the_local_share_and_is_uniform_for_even_load():
    """Card s sends D x share[d] to every other d; share[s] stays: a hot card sends less."""
    t = moe_traffic([0.4, 0.2, 0.2, 0.2], 10.0)
    assert t[0].tolist() == [0.0, 2.0, 2.0, 2.0] and t[1].tolist() == [4.0, 0.0, 2.0, 2.0]
    assert t.sum(axis=1).tolist() == pytest.approx([6.0, 8.0, 8.0, 8.0])
    p = 6
    assert np.allclose(moe_traffic(np.full(p, 1 / p), 3.0), uniform_alltoall(p, 3.0 * (p - 1) / p), rtol=1e-15)
    with pytest.raises(ValueError):
        moe_traffic([0.5, -0.1, 0.6])


@pytest.mark.parametrize("top", [Torus((5,), 1e9), Torus((4,), 1e9), Torus((2, 3), 1e9), Torus((4, 4), 2e9),
                                 Torus((3, 2, 4), 1e9), Torus((2, 2, 2), 1e9), Switched(6, 2, 8, 1e9),
                                 Switched(12, 3, 8, 1e9, 0, 0, 2, 5, 3), Switched(16, 1, 8, 1e9, 0, 0, 2, 4, 4)],
                         ids=lambda t: f"{t.kind}{getattr(t, 'dims', '')}{t.cards}")
def test_moe_link_loads_equal_routing_the_explicit_traffic(top):
    """The linear (and, on a torus, translated) loads equal ``link_loads`` of the explicit
    dispatch matrix and of its transpose, for random shares."""
    rng = np.random.default_rng(top.cards)
    sh = rng.random((4, top.cards)) ** 3
    sh /= sh.sum(axis=1, keepdims=True)
    disp, comb = moe_link_loads(top, sh)
    for layer in range(4):
        t = moe_traffic(sh[layer])
        s, d = np.nonzero(t)
        assert np.allclose(disp[layer], top.link_loads(s, d, t[s, d]), rtol=1e-12, atol=1e-15)
        assert np.allclose(comb[layer], top.link_loads(d, s, t[s, d]), rtol=1e-12, atol=1e-15)
        # the dispatch's busiest link is what alltoall_time reports for the same matrix
        rt = alltoall_time(top, t).rounds[0]
        assert (disp[layer] / top.link_bandwidths()).max() == pytest.approx(rt.bandwidth_s, rel=1e-12)
    with pytest.raises(ValueError, match="cover"):
        moe_link_loads(top, np.ones((1, top.cards + 1)))
