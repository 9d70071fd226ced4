"""A module in the model directory, beside config.pbtxt (not in the version directory)."""

VALUE = "imports model_level"


def describe():
    return "imports model_level from the model directory"
