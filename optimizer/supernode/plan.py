"""The supernode plan: how many instances are built as which option (no solver code)."""
from __future__ import annotations

from dataclasses import dataclass

from optimizer.supernode.perf import Option


@dataclass(frozen=True)
class BuiltOption:
    """``count`` instances built as ``option`` with ``sessions_per_card`` sessions on each card.

    ``index`` is the option's position in the evaluated options
    (:func:`optimizer.supernode.perf.evaluate_all`), None for a plan written by hand.
    """

    option: Option
    sessions_per_card: int
    count: int
    index: int | None = None


@dataclass(frozen=True)
class SupernodePlan:
    """The instances built, in option order."""

    instances: tuple[BuiltOption, ...]

    @property
    def counts(self) -> dict[int, int]:
        """``{option index: instances}`` of the built options."""
        return {b.index: b.count for b in self.instances}
