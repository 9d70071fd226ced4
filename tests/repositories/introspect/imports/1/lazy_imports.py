"""Imported lazily, inside initialize, by imports/1/model.py."""

VALUE = "imports lazy"


def describe():
    return "imports lazy import from the version directory"
