"""Triton's JSON form of a model configuration ("config version 1").

This is the text `initialize` gets as `args["model_config"]` and `auto_complete_config` gets
inside `pb_utils.ModelConfig`: protobuf JSON with the original field names, every field that has
no presence printed even at its default value, fields in declaration order, enum names as
strings, 64-bit integers as strings except the ones Triton turns back into numbers (`dims`,
`reshape.shape`, version numbers, batching delays, ...).

(This differs from what the KServe ModelConfig RPC returns, which is the protobuf message
itself; clients render that with defaults omitted.)
"""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Callable
from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as mc

_F = FieldDescriptor
_INT64_TYPES = {_F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_SINT64, _F.TYPE_FIXED64, _F.TYPE_SFIXED64}


def _float32(value: float) -> float:
    # A float field holds a float32: print its shortest decimal form, as protobuf does.
    for digits in range(6, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.unpack("f", struct.pack("f", candidate))[0] == value:
            return candidate
    return value


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    kind = field.type
    if kind == _F.TYPE_ENUM:
        assert field.enum_type is not None  # an enum field has its enum
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    if kind in _INT64_TYPES:
        return str(value)
    if kind in (_F.TYPE_FLOAT, _F.TYPE_DOUBLE):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        value = _float32(value) if kind == _F.TYPE_FLOAT else value
        # Like protobuf's C++ printer: integral values print without a fraction ("1", not
        # "1.0") until the printer would switch to exponent notation.
        return int(value) if value.is_integer() and abs(value) < 1e15 else value
    if kind == _F.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    if kind == _F.TYPE_MESSAGE:
        return _message(value)
    return value


def _map_key(field: FieldDescriptor, key: Any) -> str:
    if field.type == _F.TYPE_BOOL:
        return "true" if key else "false"
    return str(key)


def _message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    descriptor = cast(Descriptor, message.DESCRIPTOR)  # the stubs type it as upb or Python
    for field in descriptor.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {
                _map_key(key_field, key): _scalar(value_field, value[key]) for key in sorted(value)
            }
        elif field.is_repeated:
            out[field.name] = [_scalar(field, item) for item in value]
        elif field.has_presence:
            # Message fields and oneof members: only when set.
            if message.HasField(field.name):
                out[field.name] = _scalar(field, value)
        else:
            out[field.name] = _scalar(field, value)
    return out


def _ints(values: list[Any]) -> list[int]:
    return [int(v) for v in values]


def _fix_int(obj: dict[str, Any], key: str) -> None:
    if key in obj:
        obj[key] = int(obj[key])


def _fix_64bit_fields(config: dict[str, Any]) -> None:
    """Turn the 64-bit fields Triton fixes back into JSON numbers (ModelConfigToJson)."""
    for kind in ("input", "output"):
        for io in config.get(kind, []):
            io["dims"] = _ints(io.get("dims", []))
            if "reshape" in io:
                io["reshape"]["shape"] = _ints(io["reshape"].get("shape", []))

    specific = config.get("version_policy", {}).get("specific")
    if specific is not None:
        specific["versions"] = _ints(specific.get("versions", []))

    batching = config.get("dynamic_batching")
    if batching is not None:
        for key in ("max_queue_delay_microseconds", "priority_levels", "default_priority_level"):
            _fix_int(batching, key)
        if "default_queue_policy" in batching:
            _fix_int(batching["default_queue_policy"], "default_timeout_microseconds")
        for policy in batching.get("priority_queue_policy", {}).values():
            _fix_int(policy, "default_timeout_microseconds")

    sequence = config.get("sequence_batching")
    if sequence is not None:
        _fix_int(sequence, "max_sequence_idle_microseconds")
        for strategy in ("oldest", "direct"):
            if strategy in sequence:
                _fix_int(sequence[strategy], "max_queue_delay_microseconds")
        # Triton fixes state dims but, looking in the wrong place, not initial_state dims.
        for state in sequence.get("state", []):
            state["dims"] = _ints(state.get("dims", []))

    ensemble = config.get("ensemble_scheduling")
    if ensemble is not None:
        for step in ensemble.get("step", []):
            _fix_int(step, "model_version")

    for warmup in config.get("model_warmup", []):
        for tensor in warmup.get("inputs", {}).values():
            tensor["dims"] = _ints(tensor.get("dims", []))


def config_to_dict(config: mc.ModelConfig) -> dict[str, Any]:
    """The configuration as the dict `json.loads(args["model_config"])` gives a model."""
    result = _message(config)
    _fix_64bit_fields(result)
    return result


def config_to_args_json(config: mc.ModelConfig) -> str:
    """The exact `args["model_config"]` string Triton passes to `initialize`."""
    return json.dumps(config_to_dict(config), separators=(",", ":"), ensure_ascii=False)


class ConfigJsonError(ValueError):
    """JSON that does not describe a ModelConfig."""


def _upper_enums(value: Any, descriptor: Descriptor) -> Any:
    # Triton parses enum names case-insensitively; protobuf's Python parser does not.
    if not isinstance(value, dict):
        return value
    for name, item in value.items():
        field = descriptor.fields_by_name.get(name) or descriptor.fields_by_camelcase_name.get(name)
        if field is None:
            continue
        if field.message_type is not None:
            entry = field.message_type
            if entry.GetOptions().map_entry:
                value_field = entry.fields_by_name["value"]
                if isinstance(item, dict) and value_field.message_type is not None:
                    for v in item.values():
                        _upper_enums(v, value_field.message_type)
            elif isinstance(item, list):
                for v in item:
                    _upper_enums(v, entry)
            else:
                _upper_enums(item, entry)
        elif field.type == _F.TYPE_ENUM:
            fix = _enum_upper(field)
            value[name] = [fix(v) for v in item] if isinstance(item, list) else fix(item)
    return value


def _enum_upper(field: FieldDescriptor) -> Callable[[Any], Any]:
    assert field.enum_type is not None  # an enum field has its enum
    names = field.enum_type.values_by_name

    def fix(v: Any) -> Any:
        if isinstance(v, str) and v not in names and v.upper() in names:
            return v.upper()
        return v

    return fix


def config_from_json(text: str) -> mc.ModelConfig:
    """Parse Triton's JSON form back into a ModelConfig (unknown fields are an error)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigJsonError(str(exc)) from None
    config = mc.ModelConfig()
    try:
        json_format.ParseDict(_upper_enums(data, config.DESCRIPTOR), config)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise ConfigJsonError(str(exc)) from None
    return config
