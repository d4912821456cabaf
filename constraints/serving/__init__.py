"""Serving constraint families: one module per family, each with

* ``key(...) -> ConstraintKey`` (the row's name: family and element, e.g. ``capacity[aggregated]``),
* ``define(model, data)``: adds the family's rows, each named by its key, to one mode's MILP
  (``model``: a :class:`optimizer.serving.solve.ServingMilp` with the worker counts ``x``, the
  rate ``rate`` and ``add(expr, key)``; ``data``: its :class:`optimizer.serving.solve.ModeData`),
* ``describe(key, data) -> str``: the row in words, for conflicts and explanations.

The formula of each family is in its module's docstring.
"""
