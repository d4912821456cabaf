"""buildout objective families"""


def registry():
    """``{name: Objective}`` of the build-out objectives (``.module`` is each objective's module)."""
    from objectives.base import discover

    return discover(__name__)
