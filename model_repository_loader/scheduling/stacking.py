"""Opt-in beyond Triton: hand a batch-first model ONE request holding the whole dynamic batch.

With `parameters { key: "bridge_stack_batch" value: { string_value: "true" } }` in config.pbtxt,
the requests the dynamic batcher grouped are concatenated along dim 0 (input by input) into one
request, `execute` receives `[that request]`, and each output of its response is split back by
the requests' batch sizes. The model can then treat `requests[0]` as the batch. Triton has no
such option: the same model under Triton receives the requests as a list, as usual.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from .. import pb_utils
from ..execution import Pending, StackedParts

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
    request = pb_utils.InferenceRequest._incoming(
        inputs=inputs,
        request_id=first.request_id(),
        parameters_json=first.parameters(),
        timeout=first.timeout(),
        requested_output_names=requested,
        response_sender=None,
    )
    # Its responses go straight to the parts, split by their batch sizes (execution.py).
    stacked = Pending(request, StackedParts(parts, sizes, STACK_KEY), decoupled=False)
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
