"""experts objective families"""


def registry():
    """``{name: Objective}`` of the expert-placement objectives (one module each)."""
    from objectives.base import discover

    return discover(__name__)
