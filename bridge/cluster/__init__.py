"""The bridge as one process among many, through Dynamo endpoints only.

- protocol.py: what crosses processes, in one place: the control endpoint's path, its ops, the
  rows of its answers and the error item.
- index.py: `ClusterIndex`, the one client of the control endpoint (its cache, when it is asked
  again, how long an answer may take), for BLS across workers and the triton door.
- control_endpoint.py: `<namespace>.bridge.control`, what other processes ask this one (the
  index of the models served here).
- remote_models.py: BLS calls and ensemble steps into models other bridge processes serve
  (the loader's RemoteModels seam, over Dynamo's client and the bridge tensor form).
"""
