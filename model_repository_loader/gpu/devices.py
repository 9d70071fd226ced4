"""Which GPUs this host offers a model, found through NVML as Triton finds them through CUDA.

Triton asks the CUDA runtime for its devices and keeps those whose compute capability is at
least `--min-supported-compute-capability` (6.0 by default). Asking CUDA would make a CUDA
context in the server, before it starts its instance processes, and costs hundreds of MB of GPU
memory per device in a process that may run no GPU model at all; NVML answers the same
questions without one. NVML numbers every GPU of the host, so `CUDA_VISIBLE_DEVICES` is applied
here as the CUDA runtime applies it: the listed GPUs, in the listed order, numbered from 0 (an
index, or a `GPU-` UUID prefix; the list ends at its first entry that names no GPU, and an
empty variable hides every GPU). Indices are taken in NVML's order, which is PCI bus order:
CUDA's own order is the same with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, and on hosts whose GPUs are
all of one model, which is where indices are used in practice.

No NVML (the `nvidia-ml-py` package or the driver's library missing): no GPUs, a CPU-only host,
as Triton's CPU build behaves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# Triton's default `--min-supported-compute-capability`.
MIN_COMPUTE_CAPABILITY = 6.0


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as a model sees it: `index` is its CUDA ordinal in this process."""

    index: int
    uuid: str
    name: str
    compute_capability: float
    # NVML's own index of the device (PCI bus order, all GPUs of the host).
    nvml_index: int

    @property
    def readable(self) -> bool:
        """False for a GPU NVML lists but cannot describe (fallen off the bus, its driver in a
        bad state): it keeps its place in CUDA's numbering, and no model is placed on it."""
        return bool(self.uuid)


@contextmanager
def nvml_session() -> Iterator[Any]:
    """NVML initialised for the block: the `pynvml` module, or None where NVML is missing."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.debug("NVML is not available: %s", exc)
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def visible_devices() -> list[GpuDevice]:
    """Every GPU CUDA would show this process, whatever its compute capability."""
    with nvml_session() as nvml:
        if nvml is None:
            return []
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            log.warning("NVML cannot count this host's GPUs (%s): no GPU is used", exc)
            return []
        host = [_describe(nvml, i) for i in range(count)]
    return select_visible(host, os.environ.get("CUDA_VISIBLE_DEVICES"))


def supported_gpu_ids(
    devices: Sequence[GpuDevice], min_compute_capability: float = MIN_COMPUTE_CAPABILITY
) -> tuple[int, ...]:
    """The CUDA ordinals a KIND_GPU instance may use (Triton's "supported GPUs")."""
    supported = []
    for device in devices:
        if not device.readable:
            continue  # said when it was found (`_describe`)
        if device.compute_capability >= min_compute_capability:
            supported.append(device.index)
        else:
            log.info(
                "GPU %d (%s) has compute capability %.1f, below the minimum %.1f: not used",
                device.index,
                device.name,
                device.compute_capability,
                min_compute_capability,
            )
    return tuple(supported)


def select_visible(host: Sequence[GpuDevice], variable: str | None) -> list[GpuDevice]:
    """`host` (every GPU, NVML's order) as `CUDA_VISIBLE_DEVICES=variable` shows it to CUDA."""
    if variable is None:
        return [_renumbered(device, i) for i, device in enumerate(host)]
    chosen: list[GpuDevice] = []
    for entry in variable.split(","):
        device = _find(host, entry.strip())
        if device is None or any(d.nvml_index == device.nvml_index for d in chosen):
            break  # CUDA stops at the first entry it cannot use
        chosen.append(device)
    return [_renumbered(device, i) for i, device in enumerate(chosen)]


def _find(host: Sequence[GpuDevice], entry: str) -> GpuDevice | None:
    if entry.isdigit():
        index = int(entry)
        return host[index] if index < len(host) else None
    if entry.startswith("GPU-") and len(entry) > 4:
        matches = [d for d in host if d.uuid.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None  # MIG instances and anything else: not a whole GPU this loader places on


def _renumbered(device: GpuDevice, index: int) -> GpuDevice:
    return GpuDevice(index, device.uuid, device.name, device.compute_capability, device.nvml_index)


def _describe(nvml: Any, nvml_index: int) -> GpuDevice:
    """The GPU at NVML's `nvml_index`; one NVML cannot read is kept, not readable (one bad GPU
    of eight must not stop a server whose models can use the other seven)."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(nvml_index)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        name = _text(nvml.nvmlDeviceGetName(handle))
    except nvml.NVMLError as exc:
        log.warning("GPU %d cannot be read through NVML (%s): not used", nvml_index, exc)
        return GpuDevice(nvml_index, "", "unreadable", 0.0, nvml_index)
    return GpuDevice(
        index=nvml_index,
        uuid=uuid,
        name=name,
        compute_capability=float(f"{major}.{minor}"),
        nvml_index=nvml_index,
    )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
