"""Build-out family ``install_unit``: servers of a type come in whole groups of ``install_unit_servers``.

    n[t] = u * k[t],  k[t] integer >= 0
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "install_unit"


def define(model, p) -> None:
    u = p.install_unit_servers
    if u == 1:
        return
    for t in p.types:
        model.add(ConstraintKey(FAMILY, t.name), model.n[t.name] == u * model.k[t.name])


def describe(key: ConstraintKey, p) -> str:
    return f"{key.element} servers are installed in whole units of {p.install_unit_servers}"
