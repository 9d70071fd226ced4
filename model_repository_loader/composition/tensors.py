"""Handing tensors from one model to another without a transport in between.

Numeric tensors pass as they are: the same numpy array, or the same GPU memory, no copy (Triton
stages GPU tensors between models through CUDA IPC). BYTES tensors are the one place where
Triton's wire shows: whatever a model put in an object array (str, int, ...) reaches the next
model as `bytes` [V], so those elements are encoded here, once, as the wire would. A BLS
caller's `preferred_memory` moves its outputs to the host or to a GPU here.
"""

from __future__ import annotations

from .. import pb_utils
from ..gpu.device_array import DeviceArray


def handed_over(tensor: pb_utils.Tensor, name: str | None = None) -> pb_utils.Tensor:
    """`tensor` as the receiving model sees it, renamed to `name` if given."""
    name = tensor._name if name is None else name
    if tensor._datatype == "BYTES":
        array = tensor._wire_array()
        if array is not tensor._array or name != tensor._name:
            return pb_utils.Tensor._from_wire(name, array, "BYTES")
        return tensor
    if name != tensor._name:
        return tensor._renamed(name)
    return tensor


def response_handed_over(
    response: pb_utils.InferenceResponse, preferred: pb_utils.PreferredMemory | None = None
) -> pb_utils.InferenceResponse:
    """A BLS response whose BYTES outputs hold `bytes`, as after Triton's wire, and whose
    other outputs are where the caller's `preferred_memory` asks (no preference: where the
    callee made them)."""
    outputs = response.output_tensors()
    kind = None if preferred is None else preferred.preferred_memory_type
    if kind is None and not any(t._datatype == "BYTES" for t in outputs):
        return response
    placed = [handed_over(t) for t in outputs]
    if kind is not None:
        assert preferred is not None
        placed = [_placed(t, kind, preferred.preferred_device_id) for t in placed]
    return pb_utils.InferenceResponse._create(placed, None, response.parameters())


def _placed(tensor: pb_utils.Tensor, kind: pb_utils.MemoryType, device: int) -> pb_utils.Tensor:
    """`tensor` in host memory, or on GPU `device` (BYTES stay on the host, as in Triton)."""
    if kind == pb_utils.MemoryType.TRITONSERVER_MEMORY_CPU or tensor._datatype == "BYTES":
        return tensor._on_host()
    on_device = tensor._device
    if on_device is None:
        moved = DeviceArray.from_host(tensor._array, device)
    elif on_device.device != device:
        moved = on_device.copy_to(device)
    else:
        return tensor
    return pb_utils.Tensor._from_device(tensor._name, moved, tensor._datatype)
