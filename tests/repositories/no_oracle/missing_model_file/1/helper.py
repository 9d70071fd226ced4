"""Not a model: version 1 of missing_model_file has no model.py, only this helper."""

VALUE = 1
