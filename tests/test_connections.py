"""Connection state and set-up time as a limit on domain size (optimizer/model/connections.py):
the reference chapter's section 6.5.5 figures at print precision, with the NIC cache and the
host's set-up costs read from instances/hardware/fabric.yaml."""
from __future__ import annotations

import numpy as np
import pytest

from optimizer.errors import InputError
from optimizer.model.connections import (
    KIB, MIB, SetupCost, StateModel, directory_state, nic_cache_bytes, pairwise_connections, pairwise_setup_s,
    pairwise_state, setup_cost, ub_setup_s, ub_state,
)

# the chapter's worked constants
A = 8  # endpoints per host for the state figures
CLOUDMATRIX_HOSTS = 192
DIRECTORY_LINES = 2 ** 20
ENDPOINTS = 1024  # N = M
CORES_PER_HOST = 32


@pytest.fixture
def cache() -> float:
    return nic_cache_bytes("chapter-6.5.5")


def test_the_cache_is_256_kib(cache):
    assert cache == 256 * KIB


def test_pairwise_state_outgrows_the_cache_beyond_8_hosts(cache):
    """S_pair(H) = 512 A^2 (H-1) + 32 A with A = 8: 8 hosts fit (224.2 KiB), a ninth does not."""
    pair = pairwise_state(A)
    assert pair.max_hosts(cache) == 8
    assert pair.bytes_for(8) <= cache < pair.bytes_for(9)
    assert pair.bytes_for(8) == 512 * 64 * 7 + 32 * 8


def test_endpoint_and_channel_state_fits_over_four_thousand_hosts(cache):
    """S_UB(H) = 52 A + 56 (H-1): the 256 KiB cache holds 4,674 hosts."""
    ub = ub_state(A)
    h = ub.max_hosts(cache)
    assert h > 4000 and h == 4674
    assert ub.bytes_for(h) <= cache < ub.bytes_for(h + 1)


def test_cloudmatrix_192_hosts(cache):
    """192 hosts: about 6 MiB pairwise (5.97 MiB, 24x the cache) vs about 11 KiB (10.85 KiB) UB."""
    pair, ub = pairwise_state(A).bytes_for(CLOUDMATRIX_HOSTS), ub_state(A).bytes_for(CLOUDMATRIX_HOSTS)
    assert round(pair / MIB) == 6
    assert round(pair / cache) == 24
    assert round(ub / KIB) == 11


def test_directory_for_a_million_lines():
    """W((H-1)/8 + 8) bytes, W = 2^20: about 8 MiB at 2 hosts (8.125), 136 MiB at 1,024 (135.875)."""
    d = directory_state(DIRECTORY_LINES)
    assert round(d.bytes_for(2) / MIB) == 8
    assert round(d.bytes_for(1024) / MIB) == 136
    assert d.bytes_for(2) == pytest.approx(DIRECTORY_LINES * (1 / 8 + 8))


def test_connection_set_up():
    """4 system calls of 5 us + one 500 us out-of-band round trip = 0.52 ms per connection;
    N = M = 1,024 endpoints: 1,048,576 connections, about 545 s serially, about a thousand times
    the endpoint + channel set-up with 32 cores per host (32 x 32 = 1,024 channels)."""
    cost = setup_cost("chapter-6.5.5")
    assert round(cost.connection_s * 1e3, 2) == 0.52
    assert pairwise_connections(ENDPOINTS, ENDPOINTS) == 1_048_576
    serial = pairwise_setup_s(ENDPOINTS, ENDPOINTS, cost)
    assert round(serial) == 545
    ub = ub_setup_s(ENDPOINTS, ENDPOINTS, CORES_PER_HOST, cost)
    assert round(serial / ub, -2) == 1000
    assert ub == pytest.approx(cost.endpoint_s + (ENDPOINTS // CORES_PER_HOST) ** 2 * cost.connection_s)


def test_ub_set_up_grows_with_host_pairs_not_endpoint_pairs():
    cost = SetupCost(5e-6, 500e-6)
    one_core = ub_setup_s(64, 64, 1, cost)  # one endpoint per host: a channel per endpoint pair
    assert one_core == pytest.approx(cost.endpoint_s + pairwise_setup_s(64, 64, cost))
    assert ub_setup_s(64, 64, 8, cost) == pytest.approx(cost.endpoint_s + 64 * cost.connection_s)
    with pytest.raises(ValueError):
        ub_setup_s(64, 64, 0, cost)


@pytest.mark.parametrize("seed", range(5))
def test_max_hosts_is_the_boundary(seed):
    """For random linear state models and capacities the largest fitting H fits and H + 1 does not."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        per_host = rng.integers(1, 500) if rng.random() < 0.5 else rng.uniform(0.1, 9)
        m = StateModel("x", float(rng.integers(0, 1000)), float(per_host))
        cap = float(rng.integers(0, 100_000))
        h = m.max_hosts(cap)
        if h == 0:
            assert m.fixed_bytes > cap
        else:
            assert m.bytes_for(h) <= cap < m.bytes_for(h + 1)
    exact = StateModel("x", 100.0, 50.0)
    assert exact.max_hosts(300.0) == 5  # 100 + 50 x 4 = 300 fits exactly


def test_unknown_catalog_names_are_refused():
    with pytest.raises(InputError, match="unknown name"):
        nic_cache_bytes("cx9")
    with pytest.raises(ValueError, match="at least one host"):
        pairwise_state(A).bytes_for(0)
