"""The bridge as one process among many: what other bridge processes can ask of this one.

- control_endpoint.py: `<namespace>.bridge.control`, the index of the models served here.
"""
