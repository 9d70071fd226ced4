"""The door's CUDA shared memory, the parts that need no GPU: an input lent on a GPU becomes a
GPU tensor over the same memory, a GPU output goes to its sink as GPU memory, and a size that
does not fit gets Triton's text.

The `DeviceArray`s here describe a host buffer labelled GPU 3. Nothing on these paths may read
the memory: on this host any read (a copy to or from the host) needs CUDA and fails with
CudaUnavailable, so a path that copied through the host would fail these tests. tests/gpu
covers the copies themselves, through real CUDA regions, on a GPU host.
"""

from __future__ import annotations

import numpy as np
import pytest

from bridge.codec import decode_request, encode_raw_tensor
from bridge.frontends.triton.door_error import DoorError
from bridge.frontends.triton.tensor_checks import check_tensor
from model_repository_loader.gpu.device_array import DeviceArray
from model_repository_loader.pb_utils import Tensor
from model_repository_loader.validation import RequestError

_DEVICE = 3


def _lent(nbytes: int) -> tuple[DeviceArray, np.ndarray]:
    """Raw bytes "on GPU 3", as the door lends a CUDA region's span: 1-D uint8."""
    buffer = np.zeros(nbytes, dtype=np.uint8)
    return DeviceArray(buffer.ctypes.data, (nbytes,), np.dtype(np.uint8), _DEVICE, buffer), buffer


def _request(datatype: str, shape: list[int], values: DeviceArray) -> dict:
    data_type = {"FP32": "Float32", "INT64": "Int64", "BF16": "BFloat16"}[datatype]
    return {
        "model": "m",
        "id": "r7",
        "tensors": [
            {
                "metadata": {"name": "IN", "data_type": data_type, "shape": shape},
                "data": {"data_type": data_type, "values": values},
            }
        ],
    }


@pytest.mark.parametrize(
    ("datatype", "shape", "dtype"),
    [("FP32", [2, 3], np.float32), ("INT64", [4], np.int64), ("BF16", [1, 8], np.uint16)],
)
def test_an_input_lent_on_a_gpu_reaches_the_model_as_that_memory(
    datatype: str, shape: list[int], dtype: type
) -> None:
    raw, _ = _lent(int(np.prod(shape)) * np.dtype(dtype).itemsize)
    request = decode_request(_request(datatype, shape, raw), "m")
    tensor = request.inputs[0]
    assert not tensor.is_cpu()
    device = tensor._device
    assert device is not None
    assert (device.pointer, device.device, device.owner) == (raw.pointer, _DEVICE, raw.owner)
    assert device.shape == tuple(shape) and device.dtype == np.dtype(dtype)
    assert tensor._datatype == datatype


def test_a_lent_gpu_input_of_the_wrong_size_gets_tritons_text() -> None:
    raw, _ = _lent(12)
    with pytest.raises(RequestError) as info:
        decode_request(_request("FP32", [4], raw), "m")
    assert str(info.value) == (
        "[request id: r7] input byte size mismatch for input 'IN' for model 'm'. "
        "Expected 16, got 12"
    )


def test_the_door_checks_a_lent_gpu_input_s_size_as_any_other() -> None:
    raw, _ = _lent(12)
    check_tensor("m", "r7", "IN", "FP32", [3], raw, None)  # fits: no error, no read
    with pytest.raises(DoorError) as info:
        check_tensor("m", "r7", "IN", "FP32", [4], raw, None)
    assert info.value.message == (
        "[request id: r7] input byte size mismatch for input 'IN' for model 'm'. "
        "Expected 16, got 12"
    )


class _Sink:
    def __init__(self, room: int) -> None:
        self.room = room
        self.given: list[object] = []

    def write(self, data: memoryview | DeviceArray) -> bool:
        self.given.append(data)
        return data.nbytes <= self.room


def test_a_gpu_output_goes_to_its_sink_as_gpu_memory() -> None:
    raw, _ = _lent(24)
    output = Tensor._from_device("OUT", raw.viewed_as(np.dtype(np.float32), (2, 3)), "FP32")
    sink = _Sink(room=24)
    encoded = encode_raw_tensor(output, sink, local=True)
    assert encoded["data"]["written"] is True and encoded["data"]["values"] == b""
    assert encoded["metadata"]["shape"] == [2, 3]
    (given,) = sink.given
    assert isinstance(given, DeviceArray) and given.pointer == raw.pointer


def test_a_host_output_goes_to_its_sink_as_host_memory() -> None:
    output = Tensor("OUT", np.arange(6, dtype=np.float32))
    sink = _Sink(room=24)
    encode_raw_tensor(output, sink, local=True)
    (given,) = sink.given
    assert isinstance(given, memoryview) and bytes(given) == output.as_numpy().tobytes()


def test_a_device_array_read_as_another_type_must_keep_its_size() -> None:
    raw, _ = _lent(24)
    assert raw.viewed_as(np.dtype(np.int16), (12,)).shape == (12,)
    with pytest.raises(ValueError, match="24 bytes cannot be read as float64"):
        raw.viewed_as(np.dtype(np.float64), (4,))
