"""Decoy: default_model_filename points elsewhere, so this file must never be imported."""

raise RuntimeError("custom_entry: model.py was imported instead of custom_entry.py")
