"""`MemoryType` and `PreferredMemory`: where a BLS caller wants its output tensors placed."""

from __future__ import annotations

import enum
import operator
from typing import Any

from .errors import bind_arguments, pybind_type_error


class MemoryType(enum.IntEnum):
    """Triton's `c_python_backend_utils.MemoryType` (kGPU = 0, kCPU = 1)."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1

    def __str__(self) -> str:  # pybind11 style: "MemoryType.TRITONSERVER_MEMORY_CPU"
        return f"MemoryType.{self.name}"


_SIGNATURE = (
    "c_python_backend_utils.PreferredMemory(preferred_memory_type: "
    "triton::backend::python::PreferredMemory::MemoryType, preferred_device_id: int = 0)"
)


class PreferredMemory:
    """`PreferredMemory(preferred_memory_type, preferred_device_id=0)` for BLS requests.

    The callee's outputs are moved to the host or to that GPU before the caller sees them
    (composition/tensors.py); BYTES outputs always stay on the host.
    """

    __slots__ = ("preferred_memory_type", "preferred_device_id")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        params = bind_arguments(("preferred_memory_type", "preferred_device_id"), args, kwargs)
        kind = None if params is None else params.get("preferred_memory_type")
        device = 0 if params is None else params.get("preferred_device_id", 0)
        if not isinstance(kind, MemoryType) or not _is_int(device):
            raise pybind_type_error("__init__", _SIGNATURE, args, kwargs)
        self.preferred_memory_type: MemoryType | None = kind
        self.preferred_device_id = operator.index(device)

    @classmethod
    def _default(cls) -> PreferredMemory:
        """Triton's default: no preference (the callee decides where outputs live)."""
        memory = cls.__new__(cls)
        memory.preferred_memory_type = None
        memory.preferred_device_id = 0
        return memory


def _is_int(value: Any) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True
