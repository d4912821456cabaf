"""Compute / communication overlap from measured alone/together figures (chapter 6.4.3,
experiment 6-5), and the decode micro-batch overlap with its contention factor."""
from __future__ import annotations

import pytest

from optimizer.model.overlap import Contention, OverlapPoint, microbatch_step_s, overlapped_pair_s

MIB = 2 ** 20
# experiment 6-5 (ms): AllReduce alone, matmul alone, AllReduce together, matmul together, group
E65 = {4: (2.67, 11.53, 6.14, 11.52, 11.58), 64: (36.92, 11.03, 45.21, 12.89, 45.24)}


def _points():
    return Contention(tuple(OverlapPoint(m * MIB, *(v * 1e-3 for v in E65[m])) for m in (4, 64)))


@pytest.mark.parametrize("mib,group_ms,saving_ms", [(4, 11.58, 2.6), (64, 45.24, 2.7)])
def test_experiment_6_5_groups_and_savings(mib, group_ms, saving_ms):
    c = _points()
    comm, comp = E65[mib][0] * 1e-3, E65[mib][1] * 1e-3
    t = overlapped_pair_s(comm, comp, mib * MIB, c)
    assert t * 1e3 == pytest.approx(group_ms, abs=0.005)
    assert (comm + comp - t) * 1e3 == pytest.approx(saving_ms, abs=0.05)
    # subtracting the shorter (the ideal overlap) would claim min(comm, comp): 2.67 and 11.03 ms
    naive = comm + comp - overlapped_pair_s(comm, comp, mib * MIB, None)
    assert naive * 1e3 == pytest.approx(min(E65[mib][:2]), abs=1e-9)


def test_64_mib_saves_2_7_ms_not_11():
    p = _points().points[1]
    assert round(p.saving_s * 1e3, 1) == 2.7 and round(min(p.comm_alone_s, p.compute_alone_s) * 1e3) == 11


def test_between_the_measured_sizes_the_slowdowns_interpolate_and_never_beat_sequential():
    c = _points()
    s4, s64 = c.slowdowns(4 * MIB)[0], c.slowdowns(64 * MIB)[0]
    s16 = c.slowdowns(16 * MIB)[0]
    assert min(s4, s64) < s16 < max(s4, s64)
    assert c.slowdowns(1 * MIB) == c.slowdowns(4 * MIB)  # flat beyond the measured range
    for comm, comp in ((1e-3, 50e-3), (40e-3, 1e-3), (10e-3, 10e-3)):
        assert overlapped_pair_s(comm, comp, 16 * MIB, c) <= comm + comp + 1e-15


def test_microbatch_overlap_contention_factor():
    c, a, L = 0.2e-3, 0.15e-3, 61
    assert microbatch_step_s(c, a, L) == pytest.approx(L * c + a / 2)  # no contention: max per layer
    assert microbatch_step_s(c, a, L, kappa=10.0) == pytest.approx(L * (c + a) + a / 2)  # capped at sequential
    k = _points().kappa(64 * MIB)
    assert k == pytest.approx(45.24 / 36.92)
    assert microbatch_step_s(c, a, L, kappa=k) == pytest.approx(L * min(c + a, k * c) + a / 2)
    with pytest.raises(ValueError, match="contention factor"):
        microbatch_step_s(c, a, L, kappa=0.9)


def test_bad_measurements_are_refused():
    with pytest.raises(ValueError, match="longer member"):
        OverlapPoint(4 * MIB, 1.0, 1.0, 2.0, 1.0, 1.5)
    with pytest.raises(ValueError, match="positive"):
        OverlapPoint(4 * MIB, -1.0, 1.0, 2.0, 1.0, 2.5)
    with pytest.raises(ValueError, match="increasing"):
        Contention((OverlapPoint(64 * MIB, 1, 1, 1, 1, 1), OverlapPoint(4 * MIB, 1, 1, 1, 1, 1)))
