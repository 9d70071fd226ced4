"""What a response goes through on its way out of the model: the one place it is reshaped.

A model version owns one `ResponseShape`, built from its config: it keeps the outputs the
client asked for and applies each output's `reshape` (the model produces the `reshape` shape;
the client receives `dims`), as Triton does. `split_rows` cuts a stacked batch's response back
into its requests' rows (scheduling/stacking.py). Pure functions of the response: they call
nothing, so a request's way back (execution.Pending.deliver) enters no layer above it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from . import pb_utils

if TYPE_CHECKING:  # an instance process in a model's own environment has no tritonclient
    from tritonclient.grpc import model_config_pb2 as mc


class ResponseShape:
    """One model version's output filter and reshape."""

    __slots__ = ("_reshapes", "_batching")

    def __init__(self, config: mc.ModelConfig) -> None:
        self._reshapes = {o.name: list(o.dims) for o in config.output if o.HasField("reshape")}
        self._batching = config.max_batch_size > 0

    def apply(
        self, response: pb_utils.InferenceResponse | None, requested: frozenset[str]
    ) -> pb_utils.InferenceResponse | None:
        """Keep only the `requested` outputs and apply output reshape, as Triton does."""
        if response is None or response.has_error():
            return response
        if not self._reshapes:
            # The common case, without copying: every output was requested, nothing reshapes.
            for tensor in response._output_tensors:
                if tensor._name not in requested:
                    break
            else:
                return response
        outputs = response.output_tensors()
        kept = [t for t in outputs if t.name() in requested]
        if self._reshapes:
            kept = [self._reshape(t) for t in kept]
        if len(kept) == len(outputs) and not self._reshapes:
            return response
        return pb_utils.InferenceResponse(kept, parameters=response_parameters(response))

    def _reshape(self, tensor: pb_utils.Tensor) -> pb_utils.Tensor:
        dims = self._reshapes.get(tensor.name())
        if dims is None:
            return tensor
        batch = list(tensor._dims()[:1]) if self._batching else []
        try:
            return tensor._reshaped(batch + dims)
        except ValueError:
            return tensor  # Triton passes through what it cannot reshape


def split_rows(
    response: pb_utils.InferenceResponse, sizes: Sequence[int], what: str
) -> list[pb_utils.InferenceResponse]:
    """`response` to a stacked request, cut along dim 0 into one response per part's `sizes`.

    Raises ValueError (naming `what`, the stacking option) when an output's first dimension is
    not the stacked batch size.
    """
    total = sum(sizes)
    bounds = np.cumsum(sizes)[:-1]
    pieces: list[list[pb_utils.Tensor]] = [[] for _ in sizes]
    for tensor in response.output_tensors():
        array = tensor._array
        if array.ndim == 0 or array.shape[0] != total:
            raise ValueError(
                f"{what}: output '{tensor.name()}' has shape {list(array.shape)}; its "
                f"first dimension must be the stacked batch size {total}"
            )
        for piece, chunk in zip(pieces, np.split(array, bounds), strict=True):
            piece.append(pb_utils.Tensor._from_wire(tensor.name(), chunk, tensor._datatype))
    params = response_parameters(response)
    return [pb_utils.InferenceResponse(piece, parameters=params) for piece in pieces]


def response_parameters(response: pb_utils.InferenceResponse) -> dict | None:
    """The response's parameters as a dict for a new response (None when it has none)."""
    text = response.parameters()
    return json.loads(text) if text and text != "{}" else None
