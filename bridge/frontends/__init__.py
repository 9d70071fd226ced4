"""Front doors: what serves Triton's gRPC protocol to clients (`--frontend dynamo|triton`)."""
