"""Supernode sizing constraint families: one module per family, each with ``define(model, problem)`` and ``describe(key, problem)``."""
