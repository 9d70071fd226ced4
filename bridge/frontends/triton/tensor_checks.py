"""The checks every wire makes on an input tensor's bytes before the model's config is consulted.

Triton's gRPC and HTTP servers hand the core the same thing, a tensor with a declared datatype
and shape and its bytes, and the core checks them the same way whatever the wire: every
dimension given, the byte size the shape and datatype call for, and for BYTES the 4-byte
length prefixes. Texts and codes are Triton 2.51's [V] (tests/e2e/test_triton_door.py and the
differential suites check them). A declared shape is only multiplied out as Python integers,
so a huge shape costs nothing.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from tritonclient.grpc import model_config_pb2 as mc

from model_repository_loader.gpu.device_array import DeviceArray
from model_repository_loader.pb_utils.constants import ELEMENT_SIZES
from model_repository_loader.validation import config_datatype_name

from ... import serialized_bytes
from ...codec import OFF_LOOP_BYTES, TO_DYNAMO
from ...serialized_bytes import Budget, OverLimit
from .door_error import invalid

# Where the door walks large BYTES contents: off the event loop, two requests at a time (the
# walk allocates nothing per element, so this bounds time, not memory).
_WALKS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bytes-check")


def run_deferred_here(checks: list[Callable[[], None]]) -> None:
    """Run the checks `check_tensor` deferred, in order, on this thread (one that is not the
    event loop's); raises what they raise."""
    for check in checks:
        check()


async def run_deferred(checks: list[Callable[[], None]]) -> None:
    """Run the checks `check_tensor` deferred, in order, on a thread; raises what they raise."""
    if checks:
        await asyncio.get_running_loop().run_in_executor(_WALKS, run_deferred_here, checks)


def request_prefix(request_id: str) -> str:
    """`[request id: <id>] `, as Triton starts the texts of the core's checks."""
    return f"[request id: {request_id or '<id_unknown>'}] "


def check_bytes_framing(
    model: str,
    request_id: str,
    name: str,
    shape: Sequence[int],
    data: bytes,
    budget: Budget | None = None,
) -> None:
    """BYTES: every element a 4-byte little-endian length then its bytes, as many elements as
    the shape says, in Triton's order [V]: a cut length prefix first; then the count (an element
    cut short still counts); then the cut element. One walk that allocates nothing per element
    (one numpy pass when the elements share a length, serialized_bytes.py). Then `budget`: what
    the request's BYTES will cost once decoded, refused before a worker decodes anything."""
    framing = serialized_bytes.scan(data)
    problem = serialized_bytes.framing_problem(framing, math.prod(shape), model, request_id, name)
    if problem is not None:
        raise invalid(problem)
    if budget is not None:
        try:
            budget.charge_elements(framing.elements)
            budget.charge_decoded(framing.decoded_size)
        except OverLimit as exc:
            raise invalid(str(exc)) from None


def charge_bytes(budget: Budget, data: bytes) -> None:
    """BYTES the door framed itself (from JSON): what they will cost once decoded."""
    framing = serialized_bytes.scan(data)
    try:
        budget.charge_elements(framing.elements)
        budget.charge_decoded(framing.decoded_size)
    except OverLimit as exc:
        raise invalid(str(exc)) from None


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
    data: bytes | memoryview | DeviceArray,
    config: mc.ModelConfig | None,
    budget: Budget | None = None,
    deferred: list[Callable[[], None]] | None = None,
) -> None:
    """An input's datatype, shape and bytes agree (DoorError INVALID_ARG with Triton's text
    if not). `config` (the model's, when known) only names the datatype an unknown datatype
    should be. `budget` bounds the request's BYTES inputs (serialized_bytes.BytesLimits).

    With a `deferred` list, the walk over large BYTES contents is appended there instead of
    run: the caller runs it off the event loop (`run_deferred`), since its cost grows with the
    element count."""
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
        assert not isinstance(data, DeviceArray)  # the wires never lend BYTES
        raw = data if isinstance(data, bytes) else bytes(data)
        if deferred is not None and len(raw) > OFF_LOOP_BYTES:
            deferred.append(
                functools.partial(check_bytes_framing, model, request_id, name, shape, raw, budget)
            )
            return
        check_bytes_framing(model, request_id, name, shape, raw, budget)
        return
    expected = math.prod(shape) * ELEMENT_SIZES[datatype]
    got = data.nbytes if isinstance(data, DeviceArray) else len(data)  # GPU: a CUDA region's
    if expected != got:
        raise invalid(
            f"{request_prefix(request_id)}input byte size mismatch for input '{name}' for model "
            f"'{model}'. Expected {expected}, got {got}"
        )
