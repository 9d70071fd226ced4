"""Imported lazily, inside initialize, by imports_twin/1/model.py."""

VALUE = "imports_twin lazy"


def describe():
    return "imports_twin lazy import from the version directory"
