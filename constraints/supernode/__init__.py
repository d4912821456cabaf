"""Supernode sizing constraint families: one module per family, each with ``add(nm, ctx)`` and ``describe``."""
