"""JSON Schema files of the result envelope."""
