"""dynamo-bridge, the Dynamo side: serve a loaded Triton model repository as Dynamo workers."""
