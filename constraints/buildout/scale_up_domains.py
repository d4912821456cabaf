"""Build-out family ``scale_up_domains``: the GPUs are grouped in scale-up domains of ``cards``
GPUs, each with the fabric the supernode problem chose for it (``buildout.scale_up_domains``:
switch chips, port links, power and cost per domain, from the supernode's ``fabric_bill``).

    cards x domains >= sum_t g_t n[t]          scale_up_domains[cover]

``domains`` is an integer; each domain's fabric power (whole watts, rounded up) adds to the hall
budget (:mod:`constraints.buildout.power`) and its cost to the cost objective; the report counts
``domains x switch_chips`` chips and ``domains x port_links`` links. The domains' switch chips
are not placed in racks (their power is in the budget). Nothing is added without the section.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "scale_up_domains"
KEY = ConstraintKey(FAMILY, "cover")


def define(model, p) -> None:
    if p.domains is None:
        return
    model.add(KEY, p.domains.cards * model.domains >= model.gpus)


def describe(key: ConstraintKey, p) -> str:
    d = p.domains
    return (f"GPUs in scale-up domains of {d.cards} cards, each with {d.switch_chips} switch chips, "
            f"{d.port_links} links and {d.power_kw:g} kW of fabric")
