"""Call the composition examples with tritonclient: the ensemble, the BLS routers, the consumer.

    dynamo-bridge --model-repository examples/composition/model_repository
    python examples/composition/client.py --url localhost:8001

The same script works against a real Triton server serving that repository.
"""

from __future__ import annotations

import argparse

import numpy as np
import tritonclient.grpc as grpcclient

RAW = np.array([0.5, 1.0, 3.0, -2.0], dtype=np.float32)


def tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    data = grpcclient.InferInput(name, list(array.shape), datatype)
    data.set_data_from_numpy(array)
    return data


def rounded(array: np.ndarray) -> list[float]:
    return [round(float(v), 4) for v in array]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="localhost:8001")
    client = grpcclient.InferenceServerClient(parser.parse_args().url)
    raw = tensor("RAW", RAW, "FP32")

    result = client.infer("pipeline", [raw])
    probs = result.as_numpy("PROBS")
    print("pipeline        PROBS:", rounded(probs))
    print("pipeline        LABEL:", result.as_numpy("LABEL")[0].decode())

    for route in ("raw", "preprocessed"):
        route_input = tensor("ROUTE", np.array([route.encode()], dtype=object), "BYTES")
        result = client.infer("router", [raw, route_input])
        print(f"router {route:<12} LOGITS:", rounded(result.as_numpy("LOGITS")))

    route_input = tensor("ROUTE", np.array([b"both"], dtype=object), "BYTES")
    result = client.infer("router_async", [raw, route_input])
    print("router_async    LOGITS:", rounded(result.as_numpy("LOGITS")))

    count = tensor("COUNT", np.array([5], dtype=np.int32), "INT32")
    result = client.infer("stream_consumer", [count])
    print("stream_consumer TEXT:", result.as_numpy("TEXT")[0].decode())
    print("stream_consumer RESPONSES:", int(result.as_numpy("RESPONSES")[0]))


if __name__ == "__main__":
    main()
