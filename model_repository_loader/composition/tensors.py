"""Handing tensors from one model to another without a transport in between.

Numeric tensors pass as they are: the same numpy array, no copy. BYTES tensors are the one
place where Triton's wire shows: whatever a model put in an object array (str, int, ...) reaches
the next model as `bytes` [V], so those elements are encoded here, once, as the wire would.
"""

from __future__ import annotations

from .. import pb_utils


def handed_over(tensor: pb_utils.Tensor, name: str | None = None) -> pb_utils.Tensor:
    """`tensor` as the receiving model sees it, renamed to `name` if given."""
    name = tensor._name if name is None else name
    if tensor._datatype == "BYTES":
        array = tensor._wire_array()
        if array is not tensor._array or name != tensor._name:
            return pb_utils.Tensor._from_wire(name, array, "BYTES")
        return tensor
    if name != tensor._name:
        return pb_utils.Tensor._from_wire(name, tensor._array, tensor._datatype)
    return tensor


def response_handed_over(response: pb_utils.InferenceResponse) -> pb_utils.InferenceResponse:
    """A BLS response whose BYTES outputs hold `bytes`, as after Triton's wire."""
    outputs = response.output_tensors()
    if not any(t._datatype == "BYTES" for t in outputs):
        return response
    return pb_utils.InferenceResponse._create(
        [handed_over(t) for t in outputs], None, response.parameters()
    )
