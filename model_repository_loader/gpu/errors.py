"""The loader's CUDA errors (gpu/cuda.py, bindings.py, libcuda.py): `pb_utils` exceptions, so
a model that catches `TritonModelException` around GPU work catches them too."""

from __future__ import annotations

from ..pb_utils.errors import TritonModelException


class CudaUnavailable(TritonModelException):
    """CUDA cannot be used in this process (no driver, no device, nothing to call it with)."""


class CudaError(TritonModelException):
    """A CUDA call failed."""
