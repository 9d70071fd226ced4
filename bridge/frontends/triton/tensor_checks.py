"""The checks every wire makes on an input tensor's bytes before the model's config is consulted.

Triton's gRPC and HTTP servers hand the core the same thing, a tensor with a declared datatype
and shape and its bytes, and the core checks them the same way whatever the wire: every
dimension given, the byte size the shape and datatype call for, and for BYTES the 4-byte
length prefixes. Texts and codes are Triton 2.51's [V] (tests/e2e/test_triton_door.py and the
differential suites check them). A declared shape is only multiplied out as Python integers,
so a huge shape costs nothing.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader.pb_utils.constants import ELEMENT_SIZES
from model_repository_loader.validation import config_datatype_name

from ...codec import TO_DYNAMO
from .status import invalid


def request_prefix(request_id: str) -> str:
    """`[request id: <id>] `, as Triton starts the texts of the core's checks."""
    return f"[request id: {request_id or '<id_unknown>'}] "


def check_bytes_framing(
    model: str, request_id: str, name: str, shape: Sequence[int], data: bytes
) -> None:
    """BYTES: every element a 4-byte little-endian length then its bytes, as many elements as
    the shape says. One pass over the length prefixes, in Triton's order [V]: a cut length
    prefix first; then the count (an element cut short still counts); then the cut element."""
    expected = math.prod(shape)
    size = len(data)
    offset = 0
    count = 0
    cut: tuple[int, int] | None = None  # (length, bytes available) of an element cut short
    unpack = struct.Struct("<I").unpack_from
    while offset < size:
        if size - offset < 4:
            raise invalid(
                f"{request_prefix(request_id)}incomplete string length indicator for inference "
                f"input '{name}' for model '{model}', expecting 4 bytes but only "
                f"{size - offset} bytes available. Please make sure the string length indicator "
                "is in one buffer."
            )
        (length,) = unpack(data, offset)
        offset += 4
        count += 1
        if length > size - offset:
            cut = (length, size - offset)
            break
        offset += length
    if count < expected:
        raise invalid(
            f"{request_prefix(request_id)}expected {expected} string elements for inference "
            f"input '{name}' for model '{model}', got {count}"
        )
    if count > expected:
        raise invalid(
            f"{request_prefix(request_id)}unexpected number of string elements {count} for "
            f"inference input '{name}' for model '{model}', expecting {expected}"
        )
    if cut is not None:
        raise invalid(
            f"incomplete string data for inference input '{name}', expecting string of length "
            f"{cut[0]} but only {cut[1]} bytes available"
        )


def _config_datatype(config: mc.ModelConfig | None, name: str) -> str | None:
    if config is not None:
        for spec in config.input:
            if spec.name == name:
                return config_datatype_name(spec.data_type)
    return None


def check_tensor(
    model: str,
    request_id: str,
    name: str,
    datatype: str,
    shape: Sequence[int],
    data: bytes,
    config: mc.ModelConfig | None,
) -> None:
    """An input's datatype, shape and bytes agree (DoorError INVALID_ARG with Triton's text
    if not). `config` (the model's, when known) only names the datatype an unknown datatype
    should be."""
    if datatype not in TO_DYNAMO:
        expects = _config_datatype(config, name)
        if expects is None:
            raise invalid(f"unexpected inference input '{name}' for model '{model}'")
        raise invalid(
            f"{request_prefix(request_id)}inference input '{name}' data-type is '<invalid>', "
            f"but model '{model}' expects '{expects}'"
        )
    if any(d < 0 for d in shape):
        dims = ",".join(str(d) for d in shape)
        raise invalid(
            f"{request_prefix(request_id)}All input dimensions should be specified for input "
            f"'{name}' for model '{model}', got [{dims}]"
        )
    if datatype == "BYTES":
        check_bytes_framing(model, request_id, name, shape, data)
        return
    expected = math.prod(shape) * ELEMENT_SIZES[datatype]
    if expected != len(data):
        raise invalid(
            f"{request_prefix(request_id)}input byte size mismatch for input '{name}' for model "
            f"'{model}'. Expected {expected}, got {len(data)}"
        )
