"""Call every model of examples/model_repository and print what comes back.

Works against dynamo-bridge and against a real Triton server alike:

    dynamo-bridge --model-repository examples/model_repository
    python examples/client.py --url localhost:8001

tritonclient.grpc sends tensor data as raw bytes (raw_input_contents), so no JSON encoding
of the values happens on the way.
"""

from __future__ import annotations

import argparse

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def make_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def call_add_sub(client: grpcclient.InferenceServerClient) -> None:
    a = np.array([[1, 2, 3, 4], [10, 20, 30, 40]], dtype=np.float32)
    b = np.array([[4, 3, 2, 1], [1, 1, 1, 1]], dtype=np.float32)
    result = client.infer(
        "add_sub", [make_input("INPUT0", a, "FP32"), make_input("INPUT1", b, "FP32")]
    )
    print("add_sub      OUTPUT0 (sum):       ", result.as_numpy("OUTPUT0").tolist())
    print("add_sub      OUTPUT1 (difference):", result.as_numpy("OUTPUT1").tolist())


def call_text_case(client: grpcclient.InferenceServerClient) -> None:
    text = np.array([["hello", "wörld"]], dtype=np.object_)
    result = client.infer("text_case", [make_input("TEXT", text, "BYTES")])
    upper = [item.decode("utf-8") for item in result.as_numpy("UPPER").flat]
    print("text_case    UPPER:", upper)


def call_half_scale(client: grpcclient.InferenceServerClient) -> None:
    x = np.array([[1.0, 0.5, -2.0]], dtype=np.float16)
    result = client.infer("half_scale", [make_input("X", x, "FP16")])
    print("half_scale   Y:", result.as_numpy("Y").tolist())


def call_greeter(client: grpcclient.InferenceServerClient) -> None:
    name = make_input("NAME", np.array([b"Ada"], dtype=np.object_), "BYTES")
    title = make_input("TITLE", np.array([b"Countess"], dtype=np.object_), "BYTES")
    # Without TITLE (an optional input) and with default parameters.
    plain = client.infer("greeter", [name])
    print("greeter      GREETING:", plain.as_numpy("GREETING")[0].decode("utf-8"))
    # With TITLE, a request id and custom request parameters.
    fancy = client.infer(
        "greeter",
        [name, title],
        request_id="greet-1",
        parameters={"punctuation": "?!", "shout": True},
    )
    print("greeter      GREETING:", fancy.as_numpy("GREETING")[0].decode("utf-8"))
    print("greeter      REQUEST_ID:", fancy.as_numpy("REQUEST_ID")[0].decode("utf-8"))


def call_strict_divide(client: grpcclient.InferenceServerClient) -> None:
    num = np.array([[6.0, 9.0]], dtype=np.float32)
    for den in (np.array([[2.0, 3.0]], dtype=np.float32), np.array([[2.0, 0.0]], dtype=np.float32)):
        inputs = [make_input("NUMERATOR", num, "FP32"), make_input("DENOMINATOR", den, "FP32")]
        try:
            result = client.infer("strict_divide", inputs)
            print("strict_divide QUOTIENT:", result.as_numpy("QUOTIENT").tolist())
        except InferenceServerException as error:
            # The model's TritonError arrives with its status code and message.
            print("strict_divide error:", error.status(), error.message())


def call_auto_shape(client: grpcclient.InferenceServerClient) -> None:
    # The model has no config.pbtxt; the server still reports the completed configuration.
    config = client.get_model_config("auto_shape", as_json=True)["config"]
    print("auto_shape   max_batch_size:", config["max_batch_size"])
    x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    result = client.infer("auto_shape", [make_input("X", x, "FP32")])
    print("auto_shape   Y:", result.as_numpy("Y").tolist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="localhost:8001", help="gRPC address of the server")
    args = parser.parse_args()

    client = grpcclient.InferenceServerClient(url=args.url)
    if not client.is_server_live():
        raise SystemExit(f"server at {args.url} is not live")
    for call in (
        call_add_sub,
        call_text_case,
        call_half_scale,
        call_greeter,
        call_strict_divide,
        call_auto_shape,
    ):
        call(client)


if __name__ == "__main__":
    main()
