"""The bridge as one process among many, through Dynamo endpoints only.

- control_endpoint.py: `<namespace>.bridge.control`, what other processes ask this one (the
  index of the models served here).
- remote_models.py: BLS calls and ensemble steps into models other bridge processes serve
  (the loader's RemoteModels seam, over Dynamo's client and the bridge tensor form).
"""
