"""Supernode sizing objectives: one module per objective (``NAME``, ``SENSE``, ``UNIT``, ``expr``, ``to_unit``)."""
