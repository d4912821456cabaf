"""The build-out plan: servers, racks as installed and the fabric's switch chips (no solver code).

A :class:`BuildoutPlan` is what the solve produces and what the independent evaluator
(:mod:`optimizer.buildout.evaluate`), the explanation and the report read.
"""
from __future__ import annotations

from dataclasses import dataclass

from optimizer.buildout.patterns import RackPattern


@dataclass(frozen=True)
class RackGroup:
    """``count`` identical racks filled as ``pattern`` (``pattern.counts``: servers per type in
    problem order, then the racked switch chips when switches take rack space or power)."""

    pattern: RackPattern
    count: int

    def servers(self, types) -> dict[str, int]:
        """Servers per type name in one such rack (types with none left out)."""
        return {t.name: c for t, c in zip(types, self.pattern.counts) if c}

    def switch_chips(self, types) -> int:
        """Switch chips in one such rack."""
        return self.pattern.counts[len(types)] if len(self.pattern.counts) > len(types) else 0


@dataclass(frozen=True)
class LeafGroup:
    """``count`` leaf switch chips with ``downlinks`` GPU-facing and ``uplinks`` spine-facing ports."""

    downlinks: int
    uplinks: int
    count: int


@dataclass(frozen=True)
class BuildoutPlan:
    """One build-out.

    Attributes:
        servers: servers per type name.
        install_units: install units per type name.
        second_tier: the fabric's second (spine) tier is built.
        racks: the racks as installed, groups of identical racks.
        leaves: leaf chips by port split; the one-tier group (all ports down) first.
        spine: spine chips.
        domains: scale-up domains built (``scale_up_domains``; 0 without).
    """

    servers: dict[str, int]
    install_units: dict[str, int]
    second_tier: bool
    racks: tuple[RackGroup, ...]
    leaves: tuple[LeafGroup, ...] = ()
    spine: int = 0
    domains: int = 0

    @property
    def switch_chips(self) -> int:
        return sum(g.count for g in self.leaves) + self.spine
