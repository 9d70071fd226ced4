"""Sequence control inputs (`sequence_batching.control_input`), added to requests as Triton does.

Each configured control becomes one more input tensor of shape `[1, 1]` (`[1]` when
`max_batch_size` is 0) with the configured datatype [V]: START / END carry the request's flags,
READY is true for a real request (false for the padding Triton puts in empty direct slots), CORRID
the correlation id.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from .. import pb_utils

_Kind = mc.ModelSequenceBatching.Control

_CORRID_DTYPES = {
    mc.TYPE_UINT64: ("UINT64", np.uint64),
    mc.TYPE_INT64: ("INT64", np.int64),
    mc.TYPE_UINT32: ("UINT32", np.uint32),
    mc.TYPE_INT32: ("INT32", np.int32),
}


@dataclass(frozen=True, slots=True)
class _FlagControl:
    name: str
    kind: int
    datatype: str
    values: tuple  # (false, true) as numpy scalars


def numeric_corrid(corrid: int | str) -> int:
    """A correlation id as a numeric CORRID control sees it.

    For a string id Triton 2.51 reads the first 8 bytes of the serialized string (a 4-byte
    little-endian length, then the characters) as the number [V: "abc" -> 0x63626100000003].
    """
    if isinstance(corrid, int):
        return corrid
    data = corrid.encode()
    raw = (len(data).to_bytes(4, "little") + data)[:8].ljust(8, b"\0")
    return int.from_bytes(raw, "little")


class Controls:
    """The control tensors one sequence model wants, ready to be attached to requests."""

    def __init__(self, batching: mc.ModelSequenceBatching, batched_model: bool) -> None:
        self._shape = (1, 1) if batched_model else (1,)
        self._flags: list[_FlagControl] = []
        self._corrid: tuple[str, int] | None = None
        for control_input in batching.control_input:
            for control in control_input.control:
                if control.kind == _Kind.CONTROL_SEQUENCE_CORRID:
                    self._corrid = (control_input.name, control.data_type)
                    continue
                if control.int32_false_true:
                    datatype, values = "INT32", np.array(control.int32_false_true, np.int32)
                elif control.fp32_false_true:
                    datatype, values = "FP32", np.array(control.fp32_false_true, np.float32)
                else:
                    datatype, values = "BOOL", np.array(control.bool_false_true, np.bool_)
                self._flags.append(
                    _FlagControl(control_input.name, control.kind, datatype, tuple(values))
                )

    def tensors(self, corrid: int | str, flags: int, ready: bool) -> list[pb_utils.Tensor]:
        tensors = []
        for control in self._flags:
            if control.kind == _Kind.CONTROL_SEQUENCE_START:
                on = bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
            elif control.kind == _Kind.CONTROL_SEQUENCE_END:
                on = bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
            else:
                on = ready
            array = np.full(self._shape, control.values[int(on)])
            tensors.append(pb_utils.Tensor._from_wire(control.name, array, control.datatype))
        if self._corrid is not None:
            name, data_type = self._corrid
            if data_type == mc.TYPE_STRING:
                array = np.full(self._shape, str(corrid).encode(), dtype=np.object_)
                tensors.append(pb_utils.Tensor._from_wire(name, array, "BYTES"))
            else:
                datatype, numpy_type = _CORRID_DTYPES[data_type]
                value = numeric_corrid(corrid) & 0xFFFFFFFFFFFFFFFF
                array = np.full(self._shape, value, dtype=np.uint64).astype(numpy_type)
                tensors.append(pb_utils.Tensor._from_wire(name, array, datatype))
        return tensors
