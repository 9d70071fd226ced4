"""Opt-in beyond Triton: hand a batch-first model ONE request holding the whole dynamic batch.

With `parameters { key: "bridge_stack_batch" value: { string_value: "true" } }` in config.pbtxt,
the requests the dynamic batcher grouped are concatenated along dim 0 (input by input) into one
request, `execute` receives `[that request]`, and each output of its response is split back by
the requests' batch sizes. The model can then treat `requests[0]` as the batch. Triton has no
such option: the same model under Triton receives the requests as a list, as usual.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from .. import pb_utils
from ..execution import Pending

log = logging.getLogger(__name__)

STACK_KEY = "bridge_stack_batch"


def stacking_enabled(config: mc.ModelConfig) -> bool:
    """Whether the config asks for stacked batches (and the model can use them)."""
    value = config.parameters.get(STACK_KEY)
    if value is None or value.string_value.strip().lower() not in ("true", "1", "yes"):
        return False
    if config.max_batch_size == 0 or config.model_transaction_policy.decoupled:
        log.warning(
            "%s: '%s' needs max_batch_size > 0 and a non-decoupled model; ignored",
            config.name,
            STACK_KEY,
        )
        return False
    return True


def stacked_pending(parts: Sequence[Pending], sizes: Sequence[int]) -> Pending:
    """One request standing for `parts`: what `execute` sees; its answer is split back.

    It is a real Pending, so every instance kind (threads, processes) runs it like any other.
    """
    splitter = _Splitter(parts, sizes)
    first = parts[0].request
    inputs = [
        pb_utils.Tensor._from_wire(
            tensor.name(),
            np.concatenate([p.request._inputs[i]._array for p in parts]),
            tensor._datatype,
        )
        for i, tensor in enumerate(first._inputs)
    ]
    requested: set[str] = set()
    for part in parts:
        requested |= part.request.requested_output_names()

    def build(pending: Pending) -> pb_utils.InferenceRequest:
        return pb_utils.InferenceRequest._incoming(
            inputs=inputs,
            request_id=first.request_id(),
            parameters_json=first.parameters(),
            timeout=first.timeout(),
            requested_output_names=requested,
            response_sender=pb_utils.InferenceResponseSender(pending.deliver, decoupled=False),
            is_cancelled=pending.is_cancelled,
        )

    stacked = Pending(build, splitter.respond, lambda response: response)
    # The stacked request is cancelled once every request in it is.
    remaining = [len(parts)]
    lock = threading.Lock()

    def one_cancelled() -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            stacked.cancel()

    for part in parts:
        part.on_cancel(one_cancelled)
    return stacked


class _Splitter:
    """Hands each part its rows of the stacked response (or the error, to all)."""

    def __init__(self, parts: Sequence[Pending], sizes: Sequence[int]) -> None:
        self._parts = list(parts)
        self._sizes = list(sizes)

    def respond(self, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        if response is None or response.has_error():
            for part in self._parts:
                part.deliver(response, final)
            return
        try:
            split = self._split(response)
        except ValueError as exc:
            error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INTERNAL)
            for part in self._parts:
                part.deliver(pb_utils.InferenceResponse(error=error), True)
            return
        for part, part_response in zip(self._parts, split, strict=True):
            part.deliver(part_response, final)

    def _split(self, response: pb_utils.InferenceResponse) -> list[pb_utils.InferenceResponse]:
        total = sum(self._sizes)
        bounds = np.cumsum(self._sizes)[:-1]
        pieces: list[list[pb_utils.Tensor]] = [[] for _ in self._parts]
        for tensor in response.output_tensors():
            array = tensor._array
            if array.ndim == 0 or array.shape[0] != total:
                raise ValueError(
                    f"{STACK_KEY}: output '{tensor.name()}' has shape {list(array.shape)}; its "
                    f"first dimension must be the stacked batch size {total}"
                )
            for piece, chunk in zip(pieces, np.split(array, bounds), strict=True):
                piece.append(pb_utils.Tensor._from_wire(tensor.name(), chunk, tensor._datatype))
        text = response.parameters()
        params = json.loads(text) if text and text != "{}" else None
        return [pb_utils.InferenceResponse(piece, parameters=params) for piece in pieces]
