"""Connection state and set-up time as a limit on scale-up domain size (reference chapter
section 6.5.5).

A NIC keeps per-peer state on chip; when it outgrows the on-chip cache, contexts spill to host
memory and every message risks a PCIe round trip. Three organisations, per NIC, with ``A``
endpoints (processes, one per core) per host and ``H`` hosts in the domain:

* pairwise reliable connections (RC queue pairs): every local endpoint keeps a 512-byte
  context for every remote endpoint, ``A^2`` per remote host, plus 32 bytes per local endpoint:
  ``S_pair(H) = 512 A^2 (H - 1) + 32 A`` bytes;
* endpoint + channel (UB, Unified Bus): 52 bytes per local endpoint and one 56-byte channel per
  remote host, shared by its endpoints: ``S_UB(H) = 52 A + 56 (H - 1)`` bytes;
* a coherent directory over ``W`` lines: one presence bit per remote host and 8 bytes of tag
  and state per line, ``W ((H - 1) / 8 + 8)`` bytes. The bits are counted as bytes without
  rounding up (the chapter's formula as written: W = 2^20 lines give 8.125 MiB at H = 2).

Each is ``fixed + per_remote_host x (H - 1)`` bytes (:class:`StateModel`), compared with an
on-chip cache (256 KiB in the chapter, ``instances/hardware/fabric.yaml`` ``nics``).

Set-up time (:class:`SetupCost`): a pairwise connection costs ``system_calls`` system calls and
one out-of-band round trip to exchange addresses (4 x 5 us + 500 us = 0.52 ms), and N x M
endpoints need N x M of them, set up one after another. The endpoint + channel organisation
creates each endpoint locally (the same system calls, no out-of-band exchange; a host's ``A``
endpoints on its ``A`` cores in parallel) and one channel per pair of hosts, each costing a
connection's set-up, serially as in the pairwise count: ``(N/A)(M/A)`` channels. With
``A = 32`` cores per host, N = M = 1,024 endpoints need 1,048,576 connections (545 s) against
32 x 32 = 1,024 channels plus 20 us of endpoints (0.53 s): the ratio is ``A^2`` = 1,024,
"about a thousand times".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from optimizer.model.fabric import fabric_entry

# The chapter's formula coefficients (section 6.5.5), bytes.
RC_CONTEXT_BYTES = 512  # one reliable-connection (queue pair) context, per local x remote endpoint
RC_ENDPOINT_BYTES = 32  # per local endpoint (completion / doorbell state)
UB_ENDPOINT_BYTES = 52  # one UB endpoint ("jetty") context per local endpoint
UB_CHANNEL_BYTES = 56  # one UB channel per remote host, shared by that host's endpoints
DIRECTORY_TAG_BYTES = 8  # tag + state per directory line
DIRECTORY_BITS_PER_HOST = 1  # presence bit per remote host per line

KIB = 1024
MIB = 1024 ** 2


@dataclass(frozen=True)
class StateModel:
    """Per-NIC state ``fixed_bytes + per_remote_host_bytes x (H - 1)`` for a domain of H hosts."""

    name: str
    fixed_bytes: float
    per_remote_host_bytes: float

    def bytes_for(self, hosts):
        """State in bytes for ``hosts`` hosts (scalar or array, H >= 1).

        Raises:
            ValueError: a host count below 1.
        """
        h = np.asarray(hosts, dtype=float)
        if (h < 1).any():
            raise ValueError("a domain has at least one host")
        out = self.fixed_bytes + self.per_remote_host_bytes * (h - 1)
        return float(out) if out.ndim == 0 else out

    def max_hosts(self, capacity_bytes: float) -> int:
        """The largest H whose state fits in ``capacity_bytes`` (0 if not even one host fits)."""
        if self.fixed_bytes > capacity_bytes:
            return 0
        if self.per_remote_host_bytes <= 0:
            raise ValueError(f"{self.name} state does not grow with hosts: every domain fits")
        h = math.floor((capacity_bytes - self.fixed_bytes) / self.per_remote_host_bytes) + 1
        # guard the float floor at an exact boundary
        while self.bytes_for(h + 1) <= capacity_bytes:
            h += 1
        while h > 1 and self.bytes_for(h) > capacity_bytes:
            h -= 1
        return h


def pairwise_state(endpoints_per_host: int) -> StateModel:
    """Pairwise reliable connections: ``S_pair(H) = 512 A^2 (H - 1) + 32 A`` bytes (6.5.5)."""
    a = endpoints_per_host
    return StateModel("pairwise", RC_ENDPOINT_BYTES * a, RC_CONTEXT_BYTES * a * a)


def ub_state(endpoints_per_host: int) -> StateModel:
    """Endpoint + channel (UB): ``S_UB(H) = 52 A + 56 (H - 1)`` bytes (6.5.5)."""
    return StateModel("endpoint+channel", UB_ENDPOINT_BYTES * endpoints_per_host, UB_CHANNEL_BYTES)


def directory_state(lines: int) -> StateModel:
    """Coherent directory of ``W`` lines: ``W ((H - 1) / 8 + 8)`` bytes (6.5.5)."""
    return StateModel("directory", DIRECTORY_TAG_BYTES * lines, DIRECTORY_BITS_PER_HOST * lines / 8)


@dataclass(frozen=True)
class SetupCost:
    """Cost of setting up one connection: ``system_calls x system_call_s + oob_round_trip_s``
    (seconds; 4 x 5 us + 500 us = 0.52 ms in the chapter, ``instances/hardware/fabric.yaml``
    ``hosts``)."""

    system_call_s: float
    oob_round_trip_s: float
    system_calls: int = 4

    @property
    def connection_s(self) -> float:
        """One pairwise connection (or one UB channel): system calls + one out-of-band round trip."""
        return self.system_calls * self.system_call_s + self.oob_round_trip_s

    @property
    def endpoint_s(self) -> float:
        """One locally created endpoint: the system calls only (no peer to exchange addresses with)."""
        return self.system_calls * self.system_call_s


def pairwise_connections(n_endpoints: int, m_endpoints: int) -> int:
    """Connections between every one of N endpoints and every one of M: ``N x M``."""
    return n_endpoints * m_endpoints


def pairwise_setup_s(n_endpoints: int, m_endpoints: int, cost: SetupCost) -> float:
    """Serial set-up of N x M pairwise connections (s)."""
    return pairwise_connections(n_endpoints, m_endpoints) * cost.connection_s


def ub_setup_s(n_endpoints: int, m_endpoints: int, endpoints_per_host: int, cost: SetupCost) -> float:
    """Endpoint + channel set-up (s): every host creates its ``A`` endpoints on its ``A`` cores in
    parallel (one endpoint's time; all hosts at once), then ``ceil(N/A) x ceil(M/A)`` host-pair
    channels are set up one after another, each at a connection's cost.

    Raises:
        ValueError: ``endpoints_per_host`` below 1.
    """
    a = endpoints_per_host
    if a < 1:
        raise ValueError("at least one endpoint per host")
    hosts_n, hosts_m = -(-n_endpoints // a), -(-m_endpoints // a)
    endpoints = cost.endpoint_s  # A endpoints per host on A cores: one endpoint's time
    return endpoints + hosts_n * hosts_m * cost.connection_s


def nic_cache_bytes(name: str) -> float:
    """On-chip connection cache of NIC ``name`` in ``instances/hardware/fabric.yaml`` (bytes).

    Raises:
        InputError: unknown NIC.
    """
    return fabric_entry("nics", name)["connection_cache_kib"] * KIB


def setup_cost(name: str) -> SetupCost:
    """Connection set-up costs of host ``name`` in ``instances/hardware/fabric.yaml``.

    Raises:
        InputError: unknown host.
    """
    e = fabric_entry("hosts", name)
    return SetupCost(e["system_call_us"] * 1e-6, e["oob_round_trip_us"] * 1e-6, e["system_calls_per_connection"])
