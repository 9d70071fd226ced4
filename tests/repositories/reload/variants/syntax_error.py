"""A version of marked/1/model.py that does not compile (line 6)."""

MARK = 98


def broken(:
    pass
