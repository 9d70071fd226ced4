"""`model_warmup`: the sample requests Triton runs through each instance before the model is READY.

What Triton's core does [S: backend_model_instance.cc, GenerateWarmupData / WarmUp]:
* per instance, right after its `initialize`, the samples in config order, each `count` times;
  a sample with `batch_size: 0` is skipped;
* one call of `execute` per iteration, with `batch_size` requests of batch 1 each (the batch
  dimension is added where `max_batch_size > 0`);
* input data: `zero_data` (zeros; empty strings for BYTES), `random_data` (random bytes; BYTES
  get zero data, empty strings, as Triton does), `input_data_file` (the raw bytes of
  `<model folder>/warmup/<file>`; for BYTES the file holds Triton's serialized strings);
* the requests bypass the scheduler, and any error response fails the instance, and so the
  load: "failed to run warmup sample '<name>': <error>; " (INVALID_ARG);
* they count in the model's statistics like any request: Triton 2.51 reports a model with
  samples of batch 2 (twice) and 1 as 3 executions and 5 inferences before any client [V].

Here a sample's requests are admitted by the model version (the same checks and `Pending` as
any request) and run on the instance's own thread the way schedulers run a batch
(`run_recorded`: executed and counted), without waiting in a queue.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

from . import pb_utils
from .errors import ModelLoadError
from .execution import Pending
from .inference import InferRequest
from .scheduling.entry import run_recorded

if TYPE_CHECKING:
    from .instance import Instance
    from .model import ModelVersion

# The folder of a model that holds warmup input files (never a version folder).
WARMUP_FOLDER = "warmup"


@dataclass(frozen=True)
class WarmupSample:
    """One `model_warmup` entry, its inputs made: `requests` is one `execute` call."""

    name: str
    count: int
    requests: tuple[InferRequest, ...]


def warmup_samples(config: mc.ModelConfig, model_dir: Path) -> list[WarmupSample]:
    """Every sample of `config` that runs (batch_size > 0), with its inputs; raises
    ModelLoadError with Triton's text for an input file that is missing or too short."""
    samples = []
    for setting in config.model_warmup:
        if setting.batch_size == 0:
            continue  # Triton skips it
        inputs = [
            pb_utils.Tensor(name, _input_data(name, spec, config, model_dir))
            for name, spec in setting.inputs.items()
        ]
        requests = tuple(InferRequest(inputs=list(inputs)) for _ in range(setting.batch_size))
        samples.append(WarmupSample(setting.name, max(1, setting.count), requests))
    return samples


def warm_up(version: ModelVersion, instance: Instance, samples: list[WarmupSample]) -> None:
    """Run `samples` through `instance`; raises ModelLoadError on the first that fails."""
    for sample in samples:
        for _ in range(sample.count):
            errors = _run_once(version, instance, sample)
            if errors:
                raise ModelLoadError(
                    f"Invalid argument: failed to run warmup sample '{sample.name}': "
                    + "".join(f"{error}; " for error in errors)
                )


def _run_once(version: ModelVersion, instance: Instance, sample: WarmupSample) -> list[str]:
    """One `execute` call with the sample's requests; the error texts of their responses."""
    errors: list[str] = []
    lock = threading.Lock()
    open_requests = [len(sample.requests)]
    done = threading.Event()

    def respond(response: pb_utils.InferenceResponse | None, final: bool) -> None:
        error = response.error() if response is not None else None
        with lock:
            if error is not None:
                errors.append(error.message())
            if final:
                open_requests[0] -= 1
                if open_requests[0] == 0:
                    done.set()

    batch: list[Pending] = []
    for request in sample.requests:
        # A refusal answers `respond` at once; warm-up never goes through the response cache.
        pending = version.admit(request, respond, use_cache=False)
        if pending is not None:
            batch.append(pending)

    def run() -> None:
        run_recorded(
            version.run_batch,
            instance,
            batch,
            version.stats,
            time.monotonic_ns(),
            0,
            sum(p.batch_size for p in batch),
            len(batch),
        )

    if batch:
        instance.post(run)
    done.wait()
    return errors


def _input_data(
    name: str, spec: mc.ModelWarmup.Input, config: mc.ModelConfig, model_dir: Path
) -> np.ndarray:
    dims = list(spec.dims)
    shape = [1, *dims] if config.max_batch_size > 0 else dims
    count = int(np.prod(shape, dtype=np.int64))
    is_bytes = spec.data_type == mc.TYPE_STRING
    kind = spec.WhichOneof("input_data_type")
    if is_bytes and kind in ("zero_data", "random_data"):
        return np.full(shape, b"", dtype=np.object_)
    dtype = np.dtype(triton_to_np_dtype(mc.DataType.Name(spec.data_type).removeprefix("TYPE_")))
    if kind == "zero_data":
        return np.zeros(shape, dtype)
    if kind == "random_data":
        raw = np.frombuffer(os.urandom(count * dtype.itemsize), np.uint8)
        if dtype == np.bool_:
            return (raw != 0).reshape(shape)
        return raw.view(dtype).reshape(shape)
    if kind == "input_data_file":
        return _file_data(name, spec.input_data_file, model_dir, dtype, shape, count, is_bytes)
    raise ModelLoadError(
        f"Invalid argument: warmup setting expects input '{name}' to have input_data_type set"
    )


def _file_data(
    name: str,
    file_name: str,
    model_dir: Path,
    dtype: np.dtype,
    shape: list[int],
    count: int,
    is_bytes: bool,
) -> np.ndarray:
    folder = (model_dir / WARMUP_FOLDER).resolve()
    path = (folder / file_name).resolve()
    if not path.is_relative_to(folder):
        raise ModelLoadError(
            f"Invalid argument: warmup input file '{file_name}' of input '{name}' is not in "
            f"the model's {WARMUP_FOLDER}/ folder"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(
            f"Internal: failed to open text file for read {path}: {exc.strerror}"
        ) from None
    if is_bytes:
        try:
            strings = deserialize_bytes_tensor(data)
        except Exception as exc:
            raise ModelLoadError(
                f"Invalid argument: warmup input file {file_name} of input '{name}' does not "
                f"hold serialized strings: {exc}"
            ) from None
        if strings.size != count:
            raise ModelLoadError(
                f"Invalid argument: warmup setting expects {count} strings for input '{name}', "
                f"but the data provided from {file_name} has {strings.size}"
            )
        return strings.reshape(shape)
    expected = count * dtype.itemsize
    if len(data) < expected:
        # Triton's text, its missing space included.
        raise ModelLoadError(
            "Invalid argument: [request id: <id_unknown>] warmup setting expects "
            f"{expected} bytes, but the data provided "
            f"from {file_name}only has {len(data)} bytes"
        )
    return np.frombuffer(data[:expected], dtype).reshape(shape).copy()
