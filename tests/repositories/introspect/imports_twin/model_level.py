"""A module in the model directory, beside config.pbtxt (not in the version directory)."""

VALUE = "imports_twin model_level"


def describe():
    return "imports_twin model_level from the model directory"
