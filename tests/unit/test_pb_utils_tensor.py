"""pb_utils.Tensor: construction rules, aliasing, BYTES and DLPack (incl. BF16).

Expected values marked [V] were observed on Triton 2.51 (nvidia-pytriton's tritonserver) with
a probe model calling the same API; see the spec §1.2.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from model_repository_loader.pb_utils import Tensor, TritonModelException

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dtype_code_bits(capsule: object) -> tuple[int, int]:
    # DLTensor.dtype sits at byte 20 of a legacy DLManagedTensor (data, device, ndim before it).
    address = _get_pointer(capsule, b"dltensor")
    return ctypes.c_uint8.from_address(address + 20).value, ctypes.c_uint8.from_address(
        address + 21
    ).value


def _relabel(capsule: object, code: int) -> object:
    address = _get_pointer(capsule, b"dltensor")
    ctypes.c_uint8.from_address(address + 20).value = code
    return capsule


class _Producer:
    """A DLPack producer handing out a given legacy capsule (like an old framework)."""

    def __init__(self, capsule: object, device: tuple[int, int] = (1, 0)) -> None:
        self.capsule = capsule
        self.device = device

    def __dlpack__(self, stream: object = None) -> object:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


# -- construction ---------------------------------------------------------------------------------


@pytest.mark.parametrize("array", [[1, 2], None, np.float32(1.0), (1, 2)])
def test_non_ndarray_is_a_pybind_type_error(array: object) -> None:
    # [V] TypeError "__init__(): incompatible constructor arguments. ..." with this signature.
    with pytest.raises(TypeError) as info:
        Tensor("x", array)
    text = str(info.value)
    assert text.startswith("__init__(): incompatible constructor arguments.")
    assert "c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)" in text


def test_keywords_are_refused_like_pybind_positional_only() -> None:
    # [V] Tensor(name="x", array=a) is a TypeError in Triton (pybind names arg0/arg1).
    with pytest.raises(TypeError, match="Invoked with: kwargs: name='x'"):
        Tensor(name="x", array=np.zeros(1))


def test_name_must_be_text() -> None:
    with pytest.raises(TypeError):
        Tensor(1, np.zeros(1))
    # [V] pybind's str caster also takes bytes.
    assert Tensor(b"x", np.zeros(1)).name() == "x"


def test_empty_name() -> None:
    with pytest.raises(TritonModelException, match=r"^Tensor name cannot be an empty string\.$"):
        Tensor("", np.zeros(1))


@pytest.mark.parametrize(
    "array",
    [
        np.array(["a"]),  # unicode <U1
        np.array([1j]),
        np.array([1.0], dtype=">f4"),  # non-native byte order
        np.array(["2020-01-01"], dtype="datetime64[D]"),
    ],
)
def test_unsupported_dtypes(array: np.ndarray) -> None:
    # [V] all four give exactly this message.
    with pytest.raises(TritonModelException, match=r"^NumPy dtype is not supported\.$"):
        Tensor("x", array)


@pytest.mark.parametrize(
    ("dtype", "datatype", "code"),
    [
        (np.bool_, "BOOL", 1),
        (np.uint8, "UINT8", 2),
        (np.uint16, "UINT16", 3),
        (np.uint32, "UINT32", 4),
        (np.uint64, "UINT64", 5),
        (np.int8, "INT8", 6),
        (np.int16, "INT16", 7),
        (np.int32, "INT32", 8),
        (np.int64, "INT64", 9),
        (np.float16, "FP16", 10),
        (np.float32, "FP32", 11),
        (np.float64, "FP64", 12),
        (np.object_, "BYTES", 13),
        ("S3", "BYTES", 13),
    ],
)
def test_dtype_mapping(dtype: object, datatype: str, code: int) -> None:
    tensor = Tensor("x", np.zeros(2, dtype=dtype))
    assert tensor._datatype == datatype
    assert tensor.triton_dtype() == code


def test_contiguous_array_is_referenced_not_copied() -> None:
    # [V] as_numpy() is the very array given; later writes to it show through.
    array = np.zeros(3, dtype=np.int32)
    tensor = Tensor("x", array)
    assert tensor.as_numpy() is array
    array[0] = 7
    assert tensor.as_numpy().tolist() == [7, 0, 0]


def test_non_contiguous_array_is_copied_c_contiguous() -> None:
    # [V] ([[0, 2], [3, 5]], True) and the later write to the source is not seen.
    source = np.arange(6, dtype=np.int32).reshape(2, 3)[:, ::2]
    tensor = Tensor("x", source)
    source[0, 0] = 99
    assert tensor.as_numpy().tolist() == [[0, 2], [3, 5]]
    assert tensor.as_numpy().flags.c_contiguous


def test_zero_dimensional_array() -> None:
    # [V] shape [] and as_numpy() array(3., dtype=float32).
    tensor = Tensor("x", np.array(3.0, dtype=np.float32))
    assert tensor.shape() == []
    assert tensor.as_numpy().shape == ()
    assert float(tensor.as_numpy()) == 3.0


def test_shape_is_a_list() -> None:
    shape = Tensor("x", np.zeros((2, 2), dtype=np.float32)).shape()
    assert type(shape) is list and shape == [2, 2]


def test_is_cpu() -> None:
    assert Tensor("x", np.zeros(1)).is_cpu() is True


# -- BYTES ----------------------------------------------------------------------------------------


def test_bytes_tensor_keeps_the_models_array() -> None:
    # [V] as_numpy() of a constructed tensor returns the array as given (ints and str stay).
    array = np.array([1, "s", b"b"], dtype=object)
    assert Tensor("x", array).as_numpy() is array
    # [V] an S array stays an S array: array([b'bb', b'a'], dtype='|S3').
    s_array = np.array([b"bb\x00", b"a"], dtype=np.bytes_)
    assert Tensor("x", s_array).as_numpy().dtype == np.dtype("S3")


def test_bytes_wire_form() -> None:
    # [V] the client received [b'x\x00', b'7', b's\xc3\xa9'] for this object array.
    tensor = Tensor("B", np.array([b"x\x00", 7, "s\u00e9"], dtype=object))
    wire = tensor._wire_array()
    assert wire.dtype == np.object_
    assert wire.tolist() == [b"x\x00", b"7", b"s\xc3\xa9"]


def test_bytes_wire_form_of_s_array_strips_trailing_nuls() -> None:
    # [V] numpy drops trailing NULs of S elements: b"bb\x00" goes out as b"bb".
    wire = Tensor("x", np.array([[b"bb\x00"], [b"a"]], dtype=np.bytes_))._wire_array()
    assert wire.dtype == np.object_
    assert wire.shape == (2, 1)
    assert wire.reshape(-1).tolist() == [b"bb", b"a"]


def test_bytes_wire_form_without_conversion_is_the_same_array() -> None:
    array = np.array([[b"a", b"bc"]], dtype=object)
    assert Tensor("x", array)._wire_array() is array


# -- loader-facing ------------------------------------------------------------------------------


def test_from_wire_uses_array_as_is() -> None:
    array = np.arange(4, dtype=np.float32)
    tensor = Tensor._from_wire("IN", array, "FP32")
    assert tensor.as_numpy() is array
    assert tensor._array is array
    assert tensor._datatype == "FP32"
    assert tensor.name() == "IN"
    assert tensor.triton_dtype() == 11


def test_bf16_tensor_is_not_numpy_convertible() -> None:
    tensor = Tensor._from_wire("b", np.array([0x3F80], dtype=np.uint16), "BF16")
    with pytest.raises(
        TritonModelException,
        match=r"^Tensor dtype is BF16 and cannot be converted to NumPy\. "
        r"Use to_dlpack\(\) and from_dlpack\(\) instead\.$",
    ):
        tensor.as_numpy()
    assert tensor.triton_dtype() == 14
    assert tensor.shape() == [1]


# -- DLPack ---------------------------------------------------------------------------------------


def test_dlpack_device_is_cpu() -> None:
    assert Tensor("x", np.zeros(1)).__dlpack_device__() == (1, 0)  # [V]


def test_to_dlpack_of_bytes() -> None:
    with pytest.raises(
        TritonModelException, match=r"^DLPack does not have support for string tensors\.$"
    ):
        Tensor("x", np.array([b"a"], dtype=object)).to_dlpack()


def test_to_dlpack_is_a_legacy_capsule_sharing_memory() -> None:
    array = np.arange(4, dtype=np.float32)
    capsule = Tensor("x", array).to_dlpack()
    assert 'capsule object "dltensor"' in repr(capsule)  # [V]
    imported = Tensor.from_dlpack("y", capsule)
    array[1] = 42
    assert imported._array[1] == 42


def test_numpy_consumes_a_tensor_directly() -> None:
    # [V] np.from_dlpack(pb_tensor) works.
    array = np.arange(4, dtype=np.float32)
    view = np.from_dlpack(Tensor("x", array))
    array[0] = 9
    assert view.tolist() == [9.0, 1.0, 2.0, 3.0]


def test_a_consumer_asking_for_a_copy_gets_one() -> None:
    """`torch.from_dlpack(t, copy=True)` passes `copy=True` and aliases what it is given;
    without one the default shares the memory (the test above)."""
    torch = pytest.importorskip("torch")
    tensor = Tensor("x", np.arange(4, dtype=np.float32))
    copied = torch.from_dlpack(tensor, copy=True)
    copied[0] = 100
    assert tensor.as_numpy().tolist() == [0, 1, 2, 3]
    shared = torch.from_dlpack(tensor)
    shared[1] = 7
    assert tensor.as_numpy().tolist() == [0, 7, 2, 3]


def test_another_device_than_the_tensor_s_is_refused() -> None:
    tensor = Tensor("x", np.zeros(2, dtype=np.float32))
    with pytest.raises(BufferError, match="on DLPack device"):
        tensor.__dlpack__(dl_device=(2, 0))
    capsule = tensor.__dlpack__(dl_device=(1, 0))  # its own device: exported
    assert Tensor.from_dlpack("y", capsule).as_numpy().tolist() == [0, 0]


def test_from_dlpack_object_and_capsule() -> None:
    array = np.arange(4, dtype=np.float32)
    from_object = Tensor.from_dlpack("x", array)
    from_capsule = Tensor.from_dlpack("x", array.__dlpack__())
    assert from_object._datatype == from_capsule._datatype == "FP32"
    assert from_object.as_numpy().tolist() == from_capsule.as_numpy().tolist() == [0, 1, 2, 3]
    # Zero-copy (Triton 2.51 copies into its own memory here; sharing is the documented intent).
    array[2] = 7
    assert from_object.as_numpy()[2] == 7


def test_from_dlpack_bool() -> None:
    tensor = Tensor.from_dlpack("x", np.array([True, False]))
    assert tensor._datatype == "BOOL"
    assert tensor.as_numpy().tolist() == [True, False]  # [V]


def test_from_dlpack_rejects_non_dlpack_objects() -> None:
    # [V] text including the run of spaces from a line continuation in Triton's C++ source.
    expected = (
        "Provided tensor is not supported. Tensor must be a DLPack capsule         or have "
        "`__dlpack__` and `__dlpack_device__` attributes"
    )
    for value in (None, [1, 2], "x"):
        with pytest.raises(TritonModelException) as info:
            Tensor.from_dlpack("x", value)
        assert str(info.value) == expected


def test_from_dlpack_empty_name() -> None:
    with pytest.raises(TritonModelException, match=r"^Tensor name cannot be an empty string\.$"):
        Tensor.from_dlpack("", np.zeros(2).__dlpack__())


@pytest.mark.parametrize(
    "make", [lambda a: a[:, ::2], lambda a: a.T], ids=["inner-stride", "transposed"]
)
def test_from_dlpack_non_contiguous(make: object) -> None:
    # [V] for both.
    array = make(np.arange(6).reshape(2, 3))  # type: ignore[operator]
    with pytest.raises(
        TritonModelException,
        match=r"^DLPack tensor is not contiguous\. Only contiguous DLPack tensors that are stored "
        r"in C-Order are supported\.$",
    ):
        Tensor.from_dlpack("x", array)


def test_from_dlpack_leading_stride_is_accepted() -> None:
    # [V] Triton accepts a stride on the first dimension only; we return the right data.
    array = np.arange(12).reshape(4, 3)[::2, :]
    tensor = Tensor.from_dlpack("x", array)
    assert tensor.as_numpy().tolist() == [[0, 1, 2], [6, 7, 8]]


def test_from_dlpack_unsupported_device_and_dtype() -> None:
    with pytest.raises(
        TritonModelException, match=r"^DLDevice type 4 is not support by Python backend\.$"
    ):
        Tensor.from_dlpack("x", _Producer(np.zeros(2).__dlpack__(), (4, 0)))  # [V]
    with pytest.raises(TritonModelException, match=r"^Dtype is invalid\.$"):
        Tensor.from_dlpack("x", np.array([1j], dtype=np.complex64))  # [V]


def test_bf16_from_dlpack_and_back() -> None:
    # A producer labelling 16-bit patterns as kDLBfloat (as torch.bfloat16 does).
    bits = np.array([0x3F80, 0x4000], dtype=np.uint16)  # 1.0, 2.0 in bfloat16
    capsule = _relabel(bits.__dlpack__(), 4)
    tensor = Tensor.from_dlpack("b", _Producer(capsule))
    assert tensor._datatype == "BF16"
    assert tensor.shape() == [2]  # [V]
    assert tensor._array.dtype == np.uint16
    assert tensor._array.tolist() == [0x3F80, 0x4000]
    # [V] to_dlpack of a BF16 tensor is labelled (kDLBfloat=4, 16 bits).
    exported = tensor.to_dlpack()
    assert _dtype_code_bits(exported) == (4, 16)
    again = Tensor.from_dlpack("c", exported)
    assert again._datatype == "BF16"
    assert again._array.tolist() == [0x3F80, 0x4000]


def test_bf16_with_wrong_width() -> None:
    capsule = _relabel(np.array([1], dtype=np.uint32).__dlpack__(), 4)
    with pytest.raises(
        TritonModelException, match=r"^Expected BF16 tensor to have 16 bits, but had: 32$"
    ):
        Tensor.from_dlpack("x", capsule)  # [V]


def test_read_only_array_can_still_be_exported() -> None:
    array = np.arange(3.0)
    array.flags.writeable = False
    capsule = Tensor("x", array).to_dlpack()
    assert Tensor.from_dlpack("y", capsule).as_numpy().tolist() == [0.0, 1.0, 2.0]


class _CountingSource:
    """An ArraySource that counts how often it is asked to make its array."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self.made = 0

    def array(self) -> np.ndarray:
        self.made += 1
        return self._array


def test_a_sourced_tensor_makes_its_array_on_first_use_only() -> None:
    """Issue 38 finding 7: a BYTES input decoded when the model reads it; its shape, a rename
    or a reshape (validation, ensembles) do not make it, and tensors over one source share it."""
    source = _CountingSource(np.array([b"a", b"bc", b"", b"d"], dtype=np.object_))
    tensor = Tensor._from_source("S", source, (2, 2), "BYTES")
    assert (
        tensor.shape() == [2, 2] and tensor.is_cpu() and repr(tensor) == "<Tensor 'S' BYTES [2, 2]>"
    )
    flat = tensor._reshaped([4])
    renamed = tensor._renamed("T")
    with pytest.raises(ValueError):
        tensor._reshaped([3])
    assert source.made == 0
    assert tensor.as_numpy().tolist() == [[b"a", b"bc"], [b"", b"d"]]
    assert flat.as_numpy().tolist() == [b"a", b"bc", b"", b"d"] and renamed.name() == "T"
    assert tensor.as_numpy() is tensor.as_numpy()
    assert renamed.as_numpy().tolist() == tensor.as_numpy().tolist()
    assert source.made == 3  # once per tensor: the source itself decodes once (Serialized)
