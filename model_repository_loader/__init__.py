"""dynamo-bridge, the Triton side: a Triton Python backend without Triton."""
