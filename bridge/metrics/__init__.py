"""Metrics: Triton's `nv_inference_*` families (triton.py) and the metrics port (server.py)."""
