"""Greedy baseline: EPLB's published example, and structural properties."""
import numpy as np
import pytest

from optimizer.experts.eplb import balanced_packing, rebalance, replicate

WEIGHT = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
          [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]


def test_public_example_hierarchical():
    phy2log, log2phy, logcnt = rebalance(WEIGHT, 16, 4, 2, 8)
    assert phy2log.tolist() == [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                                [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]
    assert logcnt.tolist() == [[1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1],
                               [1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1]]
    # log2phy is the inverse of phy2log, padded with -1
    assert log2phy.shape == (2, 12, 16 - 12 + 1)
    for i in range(2):
        for e in range(12):
            reps = [r for r in log2phy[i, e] if r >= 0]
            assert len(reps) == logcnt[i, e]
            assert all(phy2log[i, r] == e for r in reps)


def test_global_policy_when_groups_do_not_divide_nodes():
    w = np.array(WEIGHT)
    hier = rebalance(w, 16, 3, 2, 8)[0]       # 3 groups on 2 nodes -> global policy
    glob = rebalance(w, 16, 1, 1, 8)[0]
    assert (hier == glob).all()


def test_replicate_is_largest_load_per_replica_first():
    rep, rank, cnt = replicate(np.array([[10.0, 4.0, 1.0]]), 6)
    # 10 -> 5 -> (5 vs 4) 5 again -> 10/3=3.33 < 4 -> expert 1
    assert cnt.tolist() == [[3, 2, 1]]
    assert rep.tolist() == [[0, 1, 2, 0, 0, 1]]


@pytest.mark.parametrize("seed", range(5))
def test_packing_fills_every_pack_exactly(seed):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 100, (3, 24)).astype(float)
    pack, rank = balanced_packing(w, 6)
    for i in range(3):
        assert np.bincount(pack[i], minlength=6).tolist() == [4] * 6
        for p in range(6):
            assert sorted(rank[i][pack[i] == p]) == [0, 1, 2, 3]
