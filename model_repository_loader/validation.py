"""Request checks against the model config, before the model sees anything.

Texts, status codes and the order of the checks are Triton 2.51's, captured from the real server
(tests/unit/fixtures/validation_oracle.json). When a request has several problems Triton reports
the first one it meets, in this order:

1. a duplicate input name (in the order the client sent them);
2. an unknown requested output (in sorted order: Triton keeps them in a std::set);
3. the input count (too many, or fewer than the required ones);
4. per input: unknown name; for batching models also a missing batch dim and batch sizes that
   disagree;
5. the batch size against max_batch_size;
6. per input: datatype, then shape against the config dims, then element count (only a zero
   batch dim can make that fail here: the transport already matched data and shape).

Steps 4 and 6 walk the inputs in the iteration order of the C++ `std::unordered_map` Triton
keeps them in (libstdc++), which also lists them in the "Got input(s) [...]" text. That order is
reproduced exactly by `triton_input_order`, so the texts match byte for byte.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from tritonclient.grpc import model_config_pb2 as mc

from .errors import TritonStatusError
from .pb_utils.constants import ELEMENT_SIZES
from .pb_utils.errors import ErrorCode
from .pb_utils.tensor import Tensor

__all__ = [
    "RequestError",
    "RequestValidator",
    "config_datatype_name",
    "no_available_versions_error",
    "parse_model_version",
    "reshaped_input_shape",
    "triton_input_order",
    "unknown_model_error",
]

_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)

# Config enum name -> the protocol (KServe) name clients send and Triton's texts use.
_DATATYPE_NAMES = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}


# Whitespace C++ `std::stol` skips, and the range of a C++ long (parse_model_version).
_STOL_SPACE = " \t\n\v\f\r"
_LONG_MAX = (1 << 63) - 1


class RequestError(TritonStatusError):
    """A request the model must not see. `str(exc)` is Triton's message; `code` its status
    (INVALID_ARG unless said otherwise)."""

    default_code = ErrorCode.INVALID_ARG


# -- model lookup texts (used by the bridge and by BLS) -------------------------------------------


def parse_model_version(text: str) -> int:
    """A client's model_version string as Triton reads it: "" is -1 (the server's choice).

    Triton parses with C++ `std::stol`: leading whitespace and a sign are accepted, trailing
    junk is ignored ("1x" is 1). No digits or out of range, and negative values, are
    INVALID_ARG with Triton's texts; 0 parses and is then simply not a served version.
    """
    if text == "":
        return -1
    rest = text.lstrip(_STOL_SPACE)
    sign = 1
    if rest[:1] in ("+", "-"):
        sign = -1 if rest[0] == "-" else 1
        rest = rest[1:]
    digits = len(rest) - len(rest.lstrip("0123456789"))
    value = sign * int(rest[:digits]) if digits else None
    if value is None or not -_LONG_MAX - 1 <= value <= _LONG_MAX:
        raise RequestError(
            f"failed to get model version from specified version string '{text}' "
            "(details: stol), version should be an integral value > 0"
        )
    if value < 0:
        raise RequestError(
            f"invalid model version specified '{text}' , version should be an integral value > 0"
        )
    return value


def unknown_model_error(model_name: str, version: int | str | None = None) -> str:
    """NOT_FOUND text for a model the server doesn't know, or a version it doesn't serve.

    `version` None, "" or -1 means "no version asked for". Triton only names the version for
    a known model: pass None when the model itself is unknown.
    """
    if version is None or version == "" or version == -1:
        return f"Request for unknown model: '{model_name}' is not found"
    return f"Request for unknown model: '{model_name}' version {version} is not found"


def version_not_ready_error(model_name: str, version: int | str) -> str:
    """UNAVAILABLE text for a version the server knows but that is not ready (failed to load)."""
    return f"Request for unknown model: '{model_name}' version {version} is not at ready state"


def no_available_versions_error(model_name: str) -> str:
    """NOT_FOUND text for a model the server knows but cannot serve (unloaded, failed to load)."""
    return f"Request for unknown model: '{model_name}' has no available versions"


# -- libstdc++ unordered_map iteration order ------------------------------------------------------

_MASK64 = (1 << 64) - 1
_MURMUR_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_HASH_SEED = 0xC70F6907
# Bucket counts of a default-constructed std::unordered_map as it grows one element at a time
# (libstdc++'s prime rehash policy): (size that triggers the rehash, new bucket count).
_BUCKET_STEPS = (
    (1, 13),
    (14, 29),
    (30, 59),
    (60, 127),
    (128, 257),
    (258, 541),
    (542, 1109),
    (1110, 2357),
    (2358, 5087),
    (5088, 10273),
    (10274, 20753),
    (20754, 42043),
    (42044, 85229),
    (85230, 172933),
    (172934, 351061),
)


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def _std_string_hash(data: bytes) -> int:
    """`std::hash<std::string>` of libstdc++ on 64-bit: `_Hash_bytes(data, len, 0xc70f6907)`."""
    length = len(data)
    aligned = length & ~7
    value = (_HASH_SEED ^ (length * _MURMUR_MUL)) & _MASK64
    for start in range(0, aligned, 8):
        word = int.from_bytes(data[start : start + 8], "little")
        value ^= (_shift_mix((word * _MURMUR_MUL) & _MASK64) * _MURMUR_MUL) & _MASK64
        value = (value * _MURMUR_MUL) & _MASK64
    if length & 7:
        value ^= int.from_bytes(data[aligned:], "little")
        value = (value * _MURMUR_MUL) & _MASK64
    value = (_shift_mix(value) * _MURMUR_MUL) & _MASK64
    return _shift_mix(value)


def _insert(
    groups: list[list[str]], by_bucket: dict[int, list[str]], key: str, bucket: int
) -> None:
    """Insert like libstdc++: nodes form one singly linked list, kept here as runs per bucket.

    A key landing in an empty bucket goes to the front of the list; a key landing in a used
    bucket goes to the front of that bucket's run.
    """
    run = by_bucket.get(bucket)
    if run is None:
        by_bucket[bucket] = run = [key]
        groups.insert(0, run)
    else:
        run.insert(0, key)


@functools.lru_cache(maxsize=1024)
def triton_input_order(names: tuple[str, ...]) -> tuple[str, ...]:
    """The order Triton iterates a request's inputs in, given the order they were sent.

    Triton adds inputs to a `std::unordered_map<std::string, Input>` as they arrive; its
    iteration order depends on the names' hashes, the bucket count and the insertion order.
    Repeated names (rejected earlier anyway) are skipped. Cached: clients repeat themselves.
    """
    groups: list[list[str]] = []
    by_bucket: dict[int, list[str]] = {}
    hashes: dict[str, int] = {}
    buckets = 1
    step = 0
    for name in names:
        if name in hashes:
            continue
        hashes[name] = _std_string_hash(name.encode("utf-8"))
        if step < len(_BUCKET_STEPS) and len(hashes) == _BUCKET_STEPS[step][0]:
            # The table grows before the insert; a rehash re-inserts the nodes in list order.
            buckets = _BUCKET_STEPS[step][1]
            step += 1
            current = [key for run in groups for key in run]
            groups, by_bucket = [], {}
            for key in current:
                _insert(groups, by_bucket, key, hashes[key] % buckets)
        _insert(groups, by_bucket, name, hashes[name] % buckets)
    return tuple(key for run in groups for key in run)


# -- the validator --------------------------------------------------------------------------------


def config_datatype_name(data_type: int) -> str:
    """Config enum value (mc.DataType) -> protocol name: TYPE_STRING -> "BYTES", TYPE_FP32 ->
    "FP32"."""
    enum_name = mc.DataType.Name(data_type)
    return _DATATYPE_NAMES.get(enum_name, enum_name)


def _dims_text(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _names_text(names: Sequence[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


class _InputSpec:
    __slots__ = (
        "name",
        "datatype",
        "element_size",
        "dims",
        "dims_text",
        "reshape",
        "optional",
        "is_shape_tensor",
    )

    def __init__(self, config: mc.ModelInput, batching: bool) -> None:
        self.name = config.name
        self.datatype = config_datatype_name(config.data_type)
        self.element_size = ELEMENT_SIZES.get(self.datatype, 0)  # 0: BYTES, counted by element
        self.dims = tuple(config.dims)
        self.dims_text = _dims_text(((-1,) if batching else ()) + self.dims)
        self.reshape = tuple(config.reshape.shape) if config.HasField("reshape") else None
        self.optional = config.optional
        self.is_shape_tensor = config.is_shape_tensor

    def matches(self, dims: Sequence[int]) -> bool:
        if len(dims) != len(self.dims):
            return False
        for want, got in zip(self.dims, dims, strict=True):
            if want != -1 and want != got:
                return False
        return True


def reshaped_input_shape(
    dims: Sequence[int], reshape: Sequence[int], shape: Sequence[int], batching: bool
) -> list[int]:
    """The shape a model sees for an input with a config `reshape`.

    `shape` is the request's (valid) shape. Variable (-1) dims of `dims` take the request's
    values, in order, and fill the -1s of `reshape`; batching models keep the batch dim in front.
    """
    body = list(shape[1:]) if batching else list(shape)
    variable = iter([got for want, got in zip(dims, body, strict=False) if want == -1])
    out = [next(variable) if d == -1 else d for d in reshape]
    return [shape[0], *out] if batching else out


class RequestValidator:
    """The checks for one model version. Build once per loaded version (from its normalized
    config) and call `validate` per request; the lookups are precomputed."""

    def __init__(self, config: mc.ModelConfig) -> None:
        self.model_name = config.name
        self.max_batch_size = config.max_batch_size
        self.batching = config.max_batch_size > 0
        self._inputs = {i.name: _InputSpec(i, self.batching) for i in config.input}
        self._config_order = [i.name for i in config.input]
        self._input_count = len(config.input)
        self._required = [i.name for i in config.input if not i.optional]
        self._outputs = frozenset(o.name for o in config.output)
        # Input name → (config dims, config reshape), for the inputs that have a reshape.
        self._reshapes = {
            spec.name: (spec.dims, spec.reshape)
            for spec in self._inputs.values()
            if spec.reshape is not None
        }

    # -- public ---------------------------------------------------------------------------------

    def validate(
        self, request_id: str, inputs: Sequence[Tensor], requested_outputs: Sequence[str] = ()
    ) -> int:
        """Raise RequestError (Triton's text and code) for the first problem Triton would report.

        Returns the request's batch size: the shared first dim for batching models (0 only in
        the corner where every input has a zero batch dim and no data is expected, a request
        Triton 2.51 accepts but never answers), 1 for models with max_batch_size 0 (Triton
        counts max(1, batch) in its statistics).
        """
        names = [t._name for t in inputs]
        if len(set(names)) != len(names):
            seen: set[str] = set()
            for name in names:
                if name in seen:
                    raise RequestError(
                        f"{self._prefix(request_id)}input '{name}' already exists in request"
                    )
                seen.add(name)
        if requested_outputs:
            self._check_outputs(requested_outputs)
        count = len(names)
        if count > self._input_count or count < len(self._required):
            raise RequestError(self._count_message(request_id, names))

        by_name = {t._name: t for t in inputs}
        order = triton_input_order(tuple(names)) if count > 1 else names
        batch = self._batch_size(request_id, order, by_name)
        if batch > self.max_batch_size:
            raise RequestError(
                f"{self._prefix(request_id)}inference request batch-size must be <= "
                f"{self.max_batch_size} for '{self.model_name}'"
            )
        for name in order:
            self._check_input(request_id, self._inputs[name], by_name[name], batch)
        return batch if self.batching else 1

    def apply_input_reshape(self, inputs: list[Tensor]) -> list[Tensor]:
        """The inputs as the model sees them: config `reshape` applied (views, no copies).

        Call after `validate`. Returns `inputs` itself when nothing needs reshaping.
        """
        if not self._reshapes or not any(t._name in self._reshapes for t in inputs):
            return inputs
        out = []
        for tensor in inputs:
            dims_and_reshape = self._reshapes.get(tensor._name)
            if dims_and_reshape is None:
                out.append(tensor)
                continue
            shape = reshaped_input_shape(*dims_and_reshape, tensor._dims(), self.batching)
            out.append(tensor._reshaped(shape))
        return out

    def model_shape(self, name: str, shape: Sequence[int]) -> list[int]:
        """The shape the model sees for input `name` sent with (valid) `shape`."""
        spec = self._inputs[name]
        if spec.reshape is None:
            return list(shape)
        return reshaped_input_shape(spec.dims, spec.reshape, shape, self.batching)

    # -- steps ----------------------------------------------------------------------------------

    @staticmethod
    def _prefix(request_id: str) -> str:
        return f"[request id: {request_id or '<id_unknown>'}] "

    def _check_outputs(self, requested_outputs: Sequence[str]) -> None:
        unknown = [name for name in requested_outputs if name not in self._outputs]
        if unknown:
            raise RequestError(
                f"unexpected inference output '{min(unknown)}' for model '{self.model_name}'"
            )

    def _count_message(self, request_id: str, names: Sequence[str]) -> str:
        sent = set(names)
        missing = [n for n in self._required if n not in sent]
        got = _names_text(triton_input_order(tuple(names)))
        # Triton drops the last character of "[" + "'a'," * n and then appends "]": with
        # nothing missing the "[" itself goes, leaving a lone "]" (sic).
        missing_text = _names_text(missing) if missing else "]"
        if self._input_count == len(self._required):
            expected = f"expected {self._input_count} inputs"
        else:
            expected = (
                f"expected number of inputs between {len(self._required)} and {self._input_count}"
            )
        return (
            f"{self._prefix(request_id)}{expected} but got {len(names)} inputs for model "
            f"'{self.model_name}'. Got input(s) {got}, but missing required input(s) "
            f"{missing_text}. Please provide all required input(s)."
        )

    def _unknown_input(self, name: str) -> RequestError:
        return RequestError(f"unexpected inference input '{name}' for model '{self.model_name}'")

    def _batch_size(self, request_id: str, order: Sequence[str], by_name: dict[str, Tensor]) -> int:
        specs = self._inputs
        if not self.batching:
            for name in order:
                if name not in specs:
                    raise self._unknown_input(name)
            return 0
        batch = 0
        for name in order:
            spec = specs.get(name)
            if spec is None:
                raise self._unknown_input(name)
            if spec.is_shape_tensor:
                continue
            shape = by_name[name]._dims()
            if not shape:
                raise RequestError(
                    f"{self._prefix(request_id)}input '{name}' has no shape but model requires "
                    f"batch dimension for '{self.model_name}'"
                )
            # As in Triton, a zero first dim does not fix the batch size: the next input's does.
            if batch == 0:
                batch = shape[0]
            elif shape[0] != batch:
                raise RequestError(
                    f"{self._prefix(request_id)}input '{name}' batch size does not match other "
                    f"inputs for '{self.model_name}'"
                )
        return batch

    def _check_input(self, request_id: str, spec: _InputSpec, tensor: Tensor, batch: int) -> None:
        if tensor._datatype != spec.datatype:
            raise RequestError(
                f"{self._prefix(request_id)}inference input '{spec.name}' data-type is "
                f"'{tensor._datatype}', but model '{self.model_name}' expects '{spec.datatype}'"
            )
        shape = tensor._dims()
        batched = self.batching and not spec.is_shape_tensor
        dims = shape[1:] if batched else shape
        if not spec.matches(dims):
            note = _BATCH_NOTE if self.batching else ""
            raise RequestError(
                f"{self._prefix(request_id)}unexpected shape for input '{spec.name}' for model "
                f"'{self.model_name}'. Expected {spec.dims_text}, got {_dims_text(shape)}. {note}"
            )
        if not batched or (shape[0] == batch and batch != 0):
            return  # the transport already matched the data to the shape
        # Only a zero batch dim gets here. Triton expects data for the request's batch size,
        # or for no batch dim at all when every first dim was zero (batch size 0).
        expected = (batch or 1) * math.prod(dims)
        if expected == 0:
            return
        if spec.element_size == 0:
            raise RequestError(
                f"{self._prefix(request_id)}expected {expected} string elements for inference "
                f"input '{spec.name}' for model '{self.model_name}', got 0"
            )
        raise RequestError(
            f"{self._prefix(request_id)}input byte size mismatch for input '{spec.name}' for "
            f"model '{self.model_name}'. Expected {expected * spec.element_size}, got 0"
        )
