"""The loader's own request and response vocabulary.

A caller (the Dynamo bridge, a BLS call, a test) hands a model an `InferRequest` built from
`pb_utils.Tensor` objects, plus a `Respond` callback. The model validates, schedules and executes
the request, and reports every response through the callback, from whatever thread produced it.
Using the pb_utils types end to end means a tensor crosses no extra conversion between the
transport, the model and BLS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .pb_utils import InferenceResponse, Tensor

ParameterValue = bool | int | float | str

# respond(response, final): `response` is None only for a flag-only final (no data);
# `final` is True on the last call for a request. Called from any thread, never concurrently
# for the same request.
Respond = Callable[[InferenceResponse | None, bool], None]


@dataclass(slots=True)
class InferRequest:
    """One inference request as a client sent it, before validation."""

    inputs: list[Tensor]
    # Names of the outputs the client asked for; empty means every output in the config.
    requested_outputs: list[str] = field(default_factory=list)
    request_id: str = ""
    # Every request parameter as sent, reserved ones (sequence_id, timeout, priority,
    # triton_*) included: the model splits them into correlation id, flags and custom ones.
    parameters: dict[str, ParameterValue] = field(default_factory=dict)
    # -1: the highest version being served.
    model_version: int = -1
