"""Serving constraint families: one module per family, each with ``add(prob, ctx)`` (PuLP,
constraints named by their :class:`~optimizer.result.ConstraintKey`) and ``describe(key, ctx)``."""
