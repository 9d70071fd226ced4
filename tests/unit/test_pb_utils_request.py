"""pb_utils.InferenceRequest: incoming accessors, the BLS constructor, exec rules.

[V] = observed on Triton 2.51 with a probe model (spec §1.3).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.pb_utils import (
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    Tensor,
    TritonModelException,
    context,
)


def _bls(**kwargs: object) -> InferenceRequest:
    kwargs.setdefault("inputs", [])
    kwargs.setdefault("requested_output_names", [])
    kwargs.setdefault("model_name", "m")
    return InferenceRequest(**kwargs)


# -- BLS constructor ------------------------------------------------------------------------------


def test_bls_defaults() -> None:
    # [V] ('', 0, 0, 0, '{}', {'B', 'A'}, [], None)
    request = _bls(requested_output_names=["B", "A", "A"])
    assert request.request_id() == ""
    assert request.correlation_id() == 0
    assert request.flags() == 0
    assert request.timeout() == 0
    assert request.parameters() == "{}"
    assert request.requested_output_names() == {"A", "B"}
    assert request.inputs() == []
    assert request.trace().get_context() is None


def test_bls_positional_and_tuples() -> None:
    # [V] positional order (request_id, correlation_id, inputs, requested_output_names, model_name)
    assert InferenceRequest("rid", 0, [], [], "m").request_id() == "rid"
    tensor = Tensor("a", np.zeros(1, dtype=np.float32))
    request = _bls(inputs=(tensor,), requested_output_names=("X",))  # [V] tuples accepted
    assert request.inputs() == [tensor]
    assert request.requested_output_names() == {"X"}


def test_bls_values_kept() -> None:
    request = _bls(
        request_id="r",
        correlation_id="seq",
        model_version=3,
        flags=3,
        timeout=5,
        parameters={"a": 1, "b": "s", "c": True},
    )
    assert request.correlation_id() == "seq"  # [V]
    assert request.flags() == 3
    assert request.timeout() == 5  # [V]
    # [V] json.dumps with spaces.
    assert request.parameters() == '{"a": 1, "b": "s", "c": true}'
    assert request._model_name == "m" and request._model_version == 3


def test_bls_correlation_id_bool_is_an_int() -> None:
    assert _bls(correlation_id=True).correlation_id() == 1  # [V]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"request_id": None},
        {"request_id": 5},
        {"inputs": None},
        {"inputs": [1]},
        {"requested_output_names": None},
        {"requested_output_names": [1]},
        {"model_name": None},
        {"correlation_id": None},
        {"flags": -1},
        {"flags": 1.5},
        {"timeout": None},
        {"model_version": None},
        {"preferred_memory": None},
        {"trace": None},
    ],
)
def test_bls_conversion_failures_are_type_errors(kwargs: dict) -> None:
    # [V] for request_id None/5, inputs None and flags -1: pybind's constructor TypeError.
    with pytest.raises(TypeError, match=r"^__init__\(\): incompatible constructor arguments\."):
        _bls(**kwargs)


def test_bls_required_arguments() -> None:
    with pytest.raises(TypeError):
        InferenceRequest(inputs=[], requested_output_names=[])


def test_bls_none_input() -> None:
    with pytest.raises(TritonModelException) as info:
        _bls(request_id="rid", inputs=[None], model_name="mm")
    # [V]
    assert str(info.value) == (
        "Input tensor for request with id 'rid' and model name 'mm' should not be empty."
    )


def test_bls_empty_output_name() -> None:
    with pytest.raises(TritonModelException) as info:
        _bls(request_id="rid", requested_output_names=[""], model_name="mm")
    # [V]
    assert str(info.value) == (
        "Requested output name for request with id 'rid' and model name 'mm' should not be empty."
    )


def test_bls_correlation_id_type() -> None:
    with pytest.raises(TritonModelException, match=r"^Correlation ID must be integer or string$"):
        _bls(correlation_id=1.5)  # [V]


def test_bls_negative_correlation_id() -> None:
    # [V] pybind's failed uint64 cast.
    with pytest.raises(RuntimeError, match=r"^Unable to cast Python instance to C\+\+ type"):
        _bls(correlation_id=-1)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"a": 1.5},
            "Expect parameters values to have type bool/int/str, found type <class 'float'>",
        ),
        (
            {"a": None},
            "Expect parameters values to have type bool/int/str, found type <class 'NoneType'>",
        ),
        ({1: "a"}, "Expect parameters keys to have type str, found type <class 'int'>"),
        ([1], "Expect N8pybind114dictE, got <class 'list'>"),
    ],
)
def test_bls_parameters(parameters: object, message: str) -> None:
    # [V] all four texts.
    with pytest.raises(TritonModelException) as info:
        _bls(parameters=parameters)
    assert str(info.value) == message


def test_set_flags() -> None:
    request = _bls()
    assert request.set_flags(3) is None  # [V] (None, 3)
    assert request.flags() == 3
    with pytest.raises(TypeError):
        request.set_flags(-1)


def test_preferred_memory() -> None:
    memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    assert _bls(preferred_memory=memory)._preferred_memory is memory
    # [V] 'MemoryType.TRITONSERVER_MEMORY_GPU', CPU is 1
    assert str(pb_utils.TRITONSERVER_MEMORY_GPU) == "MemoryType.TRITONSERVER_MEMORY_GPU"
    assert int(pb_utils.TRITONSERVER_MEMORY_CPU) == 1
    with pytest.raises(TypeError):
        pb_utils.PreferredMemory(1)  # [V]


# -- exec / async_exec ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["auto_complete", "initialize", "finalize"])
def test_exec_outside_execute(name: str) -> None:
    with context.phase(name):
        for decoupled in (False, True):
            # [V] in initialize, for both exec() and exec(decoupled=True).
            with pytest.raises(
                TritonModelException,
                match=r"^BLS is only supported during the 'execute' function\.$",
            ):
                _bls().exec(decoupled=decoupled)


def test_exec_in_execute_is_not_supported_yet() -> None:
    with context.phase("execute"):
        with pytest.raises(TritonModelException, match="not supported yet by dynamo-bridge"):
            _bls().exec()


def bound_to(executor: Any) -> context.model_context:
    """Bind an instance whose repository runs BLS with `executor`."""
    services = pb_utils.ModelServices(bls=executor)
    return context.model_context(context=context.ModelContext("m", "m_0", "", services))


def test_exec_uses_the_calling_instances_executor() -> None:
    calls = []

    def executor(request: InferenceRequest, decoupled: bool) -> InferenceResponse:
        calls.append((request.request_id(), decoupled))
        return InferenceResponse([])

    with bound_to(executor), context.phase("execute"):
        assert isinstance(_bls(request_id="r").exec(), InferenceResponse)
        _bls(request_id="d").exec(decoupled=True)
    assert calls == [("r", False), ("d", True)]


def test_async_exec_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="no running event loop"):  # [V]
        _bls().async_exec()


def test_async_exec_runs_in_the_executor_with_the_callers_phase() -> None:
    seen = []

    def executor(request: InferenceRequest, decoupled: bool) -> InferenceResponse:
        seen.append((threading.current_thread() is threading.main_thread(), context.in_execute()))
        return InferenceResponse([], parameters={"d": decoupled})

    async def execute() -> InferenceResponse:
        with context.phase("execute"):
            return await _bls().async_exec(decoupled=True)

    with bound_to(executor):
        response = asyncio.run(execute())
    assert seen == [(False, True)]
    assert response.parameters() == '{"d": true}'


def test_async_exec_outside_execute_fails_on_await() -> None:
    async def initialize() -> None:
        with context.phase("initialize"):
            future = _bls().async_exec()
            with pytest.raises(TritonModelException, match="only supported during the 'execute'"):
                await future

    asyncio.run(initialize())


# -- incoming requests ----------------------------------------------------------------------------


def _incoming(**overrides: object) -> InferenceRequest:
    sender = InferenceResponseSender(lambda r, f: None, decoupled=False)
    arguments: dict = {
        "inputs": [Tensor("IN", np.zeros(2, dtype=np.float32))],
        "request_id": "r1",
        "correlation_id": 7,
        "flags": 3,
        "timeout": 1000,
        "parameters_json": '{"ps":"s","pi":3,"pb":true}',
        "requested_output_names": {"OUT", "B"},
        "response_sender": sender,
        "is_cancelled": None,
    }
    arguments.update(overrides)
    return InferenceRequest._incoming(**arguments)


def test_incoming_accessors() -> None:
    request = _incoming()
    assert [t.name() for t in request.inputs()] == ["IN"]
    assert request.request_id() == "r1"
    assert request.correlation_id() == 7
    assert request.flags() == 3
    assert request.timeout() == 1000
    assert request.parameters() == '{"ps":"s","pi":3,"pb":true}'
    assert request.requested_output_names() == {"OUT", "B"}
    assert request.trace().get_context() is None  # [V]
    assert request.is_cancelled() is False


def test_incoming_sender_is_the_same_object() -> None:
    request = _incoming()
    assert request.get_response_sender() is request.get_response_sender()  # [V]


def test_incoming_accessors_return_copies() -> None:
    request = _incoming()
    request.inputs().clear()
    request.requested_output_names().clear()
    assert len(request.inputs()) == 1
    assert request.requested_output_names() == {"OUT", "B"}


def test_incoming_cancellation_sources() -> None:
    event = threading.Event()
    request = _incoming(is_cancelled=event)
    assert request.is_cancelled() is False
    event.set()
    assert request.is_cancelled() is True
    flag = {"v": False}
    request = _incoming(is_cancelled=lambda: flag["v"])
    flag["v"] = True
    assert request.is_cancelled() is True


def test_release_flags() -> None:
    request = _incoming()
    assert request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert request._release_flags == 2


def test_bls_request_has_no_sender() -> None:
    with pytest.raises(TritonModelException):
        _bls().get_response_sender()
    assert _bls().is_cancelled() is False


def test_get_input_tensor_by_name() -> None:
    request = _incoming()
    assert pb_utils.get_input_tensor_by_name(request, "IN").name() == "IN"
    assert pb_utils.get_input_tensor_by_name(request, "NOPE") is None  # [V]
