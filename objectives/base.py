"""What every objective of every problem declares: its name, unit, definition and sense.

Each problem's objectives live in ``objectives/<problem>/``, one module per objective, each
exposing ``OBJECTIVE`` (an instance of :class:`Objective` or a problem-specific subclass).
:func:`discover` collects them, so adding an objective touches one file.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Objective:
    """An objective's identity.

    Attributes:
        name: the ``--objective`` name.
        unit: unit of its value, e.g. ``"ms"``.
        definition: one sentence a reader of a saved result needs, with the unit.
        sense: ``"min"`` or ``"max"``.
        default: the problem's default objective.
    """

    name: str
    unit: str
    definition: str
    sense: Literal["min", "max"] = "min"
    default: bool = False
    module: Any = field(default=None, compare=False, repr=False, kw_only=True)  # the module that defines it

    def fmt(self, value: float) -> str:
        """``value`` with its unit for tables."""
        return f"{value:.4g} {self.unit}"

    def describe(self) -> dict:
        return {"name": self.name, "unit": self.unit, "definition": self.definition, "sense": self.sense}


def discover(package: str) -> dict[str, Objective]:
    """``{name: objective}`` of every module of ``package`` that defines ``OBJECTIVE`` (or, in the
    module style, ``NAME``/``UNIT``/``SENSE``/``DEFINITION`` and ``DEFAULT``; see :func:`from_module`).

    Raises:
        ValueError: two modules declare the same name, or none (or several) is the default.
    """
    pkg = importlib.import_module(package)
    found: dict[str, Objective] = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        mod = importlib.import_module(f"{package}.{info.name}")
        obj = getattr(mod, "OBJECTIVE", None)
        if obj is None and hasattr(mod, "NAME"):
            obj = from_module(mod)
        if obj is None:
            continue
        if obj.name in found:
            raise ValueError(f"{package}: objective name '{obj.name}' declared twice")
        found[obj.name] = obj
    defaults = [o.name for o in found.values() if o.default]
    if found and len(defaults) != 1:
        raise ValueError(f"{package}: exactly one objective must be the default (found {defaults})")
    return found


def default_of(objectives: dict[str, Objective]) -> str:
    return next(o.name for o in objectives.values() if o.default)


def from_module(mod) -> Objective:
    """An :class:`Objective` for a module-style objective (``NAME``, ``UNIT``, ``SENSE``, optional
    ``DEFINITION`` (else the docstring's first sentence) and ``DEFAULT``); ``.module`` is the module,
    whose functions the problem's formulation calls."""
    doc = (mod.__doc__ or "").strip().replace("\n", " ")
    definition = getattr(mod, "DEFINITION", None) or doc.split(". ")[0]
    return Objective(name=mod.NAME, unit=mod.UNIT, definition=definition, sense=getattr(mod, "SENSE", "min"),
                     default=bool(getattr(mod, "DEFAULT", False)), module=mod)
