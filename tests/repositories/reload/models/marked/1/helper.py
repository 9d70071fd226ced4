"""Imported by model.py; the tests edit HELPER_MARK to check a helper-module change reloads."""

HELPER_MARK = 1
