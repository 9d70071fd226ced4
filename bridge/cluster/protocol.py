"""What bridge processes say to each other, in one place: the control endpoint's path, its ops,
the rows of its answers, and the error item (docs/worker_protocol.md §1, §2).

Both sides import these names from here: the control endpoint's server side
(control_endpoint.py) and its one client (index.py), which BLS across workers
(remote_models.py) and the triton door (bridge/frontends/triton/directory.py) read through. On
the wire everything stays a plain dict (msgpack on Dynamo's request plane); the rows are typed
here, each with `to_wire()` for the side that sends it and a lenient `from_wire()` for the side
that reads it (a missing or odd field reads as empty, so one malformed row spoils nothing else).

Nothing here imports the rest of the bridge: the model side, the door and the codec all use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from model_repository_loader.pb_utils.errors import ErrorCode

# `<namespace>.bridge.control`: model components never use the component name `bridge`
# (bridge/models/endpoint.py `component_name` always ends with `-<hash>`), so the two never meet.
CONTROL_COMPONENT = "bridge"
CONTROL_ENDPOINT = "control"
# Every index row carries this: the model endpoints of a bridge worker take the bridge form.
BRIDGE_FORM_VERSION = 1


def control_path(namespace: str) -> str:
    """The control endpoint's path in `namespace`."""
    return f"{namespace}.{CONTROL_COMPONENT}.{CONTROL_ENDPOINT}"


class Op(StrEnum):
    """The control endpoint's ops (the request's `"op"`)."""

    INDEX = "index"  # → {"worker", "models": [IndexRow]}
    STATS = "stats"  # → {"worker", "models": [StatsRow]}
    FOLDERS = "folders"  # → {"worker", "names": [str]} or an error
    LOAD = "load"  # {"name", "config", "files"} → {} or an error
    UNLOAD = "unload"  # {"name"} → {} or an error
    LOG_SETTINGS = "log_settings"  # {"settings"} → {"settings"} or an error
    READY = "ready"  # {"name", "version"} → {"worker", "models": [ReadyRow]}


def control_request(op: Op, **fields: Any) -> dict[str, Any]:
    """A control request: `{"op": <name>, **fields}` (the name as a plain str on the wire)."""
    return {"op": op.value, **fields}


def load_request(name: str, config: str = "", files: Mapping[str, bytes] | None = None) -> dict:
    """Load `name` (`config`: a JSON config to use; `files`: `file:<path>` → contents)."""
    return control_request(Op.LOAD, name=name, config=config, files=dict(files or {}))


def unload_request(name: str) -> dict[str, Any]:
    return control_request(Op.UNLOAD, name=name)


def ready_request(name: str = "", version: int = -1) -> dict[str, Any]:
    """Triton's runtime readiness of `name`'s `version` (-1: the newest served) on a worker;
    `name` "": of every model it serves, as strict server readiness asks (the worker stops at
    the first one not ready)."""
    return control_request(Op.READY, name=name, version=version)


def log_settings_request(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Change the log settings named (Triton's LogSettings names); `{}` only reads them."""
    return control_request(Op.LOG_SETTINGS, settings=dict(settings))


# -- answers ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One model name a worker knows (op `index`), ready or not."""

    name: str
    versions: tuple[str, ...] = ()  # its versions (those that failed to load too)
    ready: bool = False
    reason: str = ""  # why it is not ready
    endpoint: str = ""  # the generation serving it now ("" when none)
    config: bytes = b""  # its serialized Triton ModelConfig (empty when none is loaded)
    bridge_form: int = BRIDGE_FORM_VERSION

    @property
    def takes_requests(self) -> bool:
        return self.ready and bool(self.endpoint)

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": list(self.versions),
            "ready": self.ready,
            "reason": self.reason,
            "endpoint": self.endpoint,
            "config": self.config,
            "bridge_form": self.bridge_form,
        }

    @classmethod
    def from_wire(cls, item: Any) -> IndexRow:
        row = item if isinstance(item, dict) else {}
        config, form = row.get("config"), row.get("bridge_form")
        return cls(
            name=str(row.get("name", "")),
            versions=tuple(str(v) for v in row.get("versions", ())),
            ready=bool(row.get("ready")),
            reason=str(row.get("reason") or ""),
            endpoint=str(row.get("endpoint") or ""),
            config=bytes(config) if isinstance(config, bytes | bytearray) else b"",
            bridge_form=form if isinstance(form, int) else 0,
        )


@dataclass(frozen=True, slots=True)
class IndexAnswer:
    """One worker's answer to `index`: the worker (`<host>:<pid>`), its rows and its host id."""

    worker: str
    models: tuple[IndexRow, ...] = ()
    # The worker's host id (bridge/transport/shm_regions.py); "" when it published none.
    host: str = ""

    def to_wire(self) -> dict[str, Any]:
        rows = [row.to_wire() for row in self.models]
        return {"worker": self.worker, "host": self.host, "models": rows}

    @classmethod
    def from_wire(cls, item: Any) -> IndexAnswer:
        answer = item if isinstance(item, dict) else {}
        rows = tuple(IndexRow.from_wire(row) for row in answer.get("models", ()))
        return cls(str(answer.get("worker", "")), rows, str(answer.get("host") or ""))


@dataclass(frozen=True, slots=True)
class ReadyRow:
    """One loaded model version's runtime readiness (op `ready`): `reason` "" when ready."""

    name: str
    version: int
    reason: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "reason": self.reason}

    @classmethod
    def from_wire(cls, item: Any) -> ReadyRow:
        """A malformed row reads as not ready (it cannot say that the model is)."""
        row = item if isinstance(item, dict) else {}
        version = row.get("version")
        reason = row.get("reason")
        return cls(
            name=str(row.get("name", "")),
            version=version if isinstance(version, int) else -1,
            reason=reason if isinstance(reason, str) else "malformed ready row",
        )


# A stats row's durations (Triton's InferStatistics and InferBatchStatistics fields), each
# `[count, ns]` on the wire, as Triton keeps them.
INFER_KINDS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
BATCH_KINDS = ("compute_input", "compute_infer", "compute_output")

Duration = tuple[int, int]  # (count, ns)


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One batch size's statistics of a StatsRow."""

    batch_size: int
    durations: dict[str, Duration] = field(default_factory=dict)  # BATCH_KINDS → (count, ns)

    def to_wire(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, **_durations_to_wire(self.durations)}

    @classmethod
    def from_wire(cls, item: Any) -> BatchRow:
        """Raises KeyError / TypeError / ValueError without a batch size."""
        return cls(int(item["batch_size"]), _durations_from_wire(item, BATCH_KINDS))


@dataclass(frozen=True, slots=True)
class StatsRow:
    """One served model version's statistics (op `stats`); a door sums them over workers."""

    name: str
    version: str
    last_inference: int = 0  # ms since the epoch
    inference_count: int = 0
    execution_count: int = 0
    inference: dict[str, Duration] = field(default_factory=dict)  # INFER_KINDS → (count, ns)
    batches: tuple[BatchRow, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": _durations_to_wire(self.inference),
            "batch_stats": [batch.to_wire() for batch in self.batches],
        }

    @classmethod
    def from_wire(cls, item: Any) -> StatsRow:
        """Raises KeyError / TypeError / ValueError for a row with no name or version."""
        return cls(
            name=str(item["name"]),
            version=str(item["version"]),
            last_inference=int(item.get("last_inference", 0)),
            inference_count=int(item.get("inference_count", 0)),
            execution_count=int(item.get("execution_count", 0)),
            inference=_durations_from_wire(item.get("inference_stats", {}), INFER_KINDS),
            batches=tuple(BatchRow.from_wire(b) for b in item.get("batch_stats", ())),
        )


def _durations_to_wire(durations: Mapping[str, Duration]) -> dict[str, list[int]]:
    return {kind: [count, ns] for kind, (count, ns) in durations.items()}


def _durations_from_wire(item: Mapping[str, Any], kinds: tuple[str, ...]) -> dict[str, Duration]:
    out = {}
    for kind in kinds:
        pair = item.get(kind)
        if pair:
            out[kind] = (int(pair[0]), int(pair[1]))
    return out


# -- errors -------------------------------------------------------------------------------------
# An error travels as an item `{"code": "<ErrorCode name>", "message": "<Triton's text>"}`: in a
# control answer as `{"error": item}`, in a bridge-form response as `{"error": item, "final", ...}`
# (bridge/codec.py). Each side maps the code to its own status once.

_CODES = {code.name: code for code in ErrorCode}


def error_item(code: ErrorCode, message: str) -> dict[str, str]:
    return {"code": code.name, "message": message}


def error_answer(code: ErrorCode, message: str) -> dict[str, Any]:
    """A control answer that is an error (errors are answers, never exceptions)."""
    return {"error": error_item(code, message)}


def _code_by_name(name: object) -> ErrorCode:
    """`"INVALID_ARG"` → ErrorCode.INVALID_ARG; an unknown name is INTERNAL."""
    return _CODES.get(str(name), ErrorCode.INTERNAL)


def read_error(item: object) -> tuple[ErrorCode, str]:
    """An error item's code and text; a malformed item is INTERNAL, saying what came."""
    if not isinstance(item, dict):
        return ErrorCode.INTERNAL, f"malformed error from the model's worker: {item!r}"
    return _code_by_name(item.get("code", "")), str(item.get("message", ""))
