"""Triton's GPU metrics (`nv_gpu_*`, `nv_energy_consumption`), read from NVML at each scrape.

The families, HELP texts, types, the `gpu_uuid` label and the six-decimal numbers are those
Triton serves (metrics.cc): utilization as a fraction, memory in bytes, power in watts, and
the energy used since the server started, in joules. One sample per GPU this process may use
(`gpu/devices.py`: `CUDA_VISIBLE_DEVICES` applied). A reading NVML does not support on a GPU
(power on some boards) is left out for that GPU, as Triton leaves it out.

Absent on a host without GPUs or NVML, and with `--allow-gpu-metrics false`. Triton reads NVML
on its metrics interval; reading at the scrape costs a few NVML calls per GPU and never shows a
stale value.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from model_repository_loader.gpu.devices import GpuDevice

log = logging.getLogger("dynamo_bridge")

_GAUGE, _COUNTER = "gauge", "counter"

# name, HELP, type, reading (NVML module, handle, energy at start in mJ) -> value
_FAMILIES: tuple[tuple[str, str, str, Callable[[Any, Any, int | None], float]], ...] = (
    (
        "nv_gpu_utilization",
        "GPU utilization rate [0.0 - 1.0)",
        _GAUGE,
        lambda nvml, h, _: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
    ),
    (
        "nv_gpu_memory_total_bytes",
        "GPU total memory, in bytes",
        _GAUGE,
        lambda nvml, h, _: float(nvml.nvmlDeviceGetMemoryInfo(h).total),
    ),
    (
        "nv_gpu_memory_used_bytes",
        "GPU used memory, in bytes",
        _GAUGE,
        lambda nvml, h, _: float(nvml.nvmlDeviceGetMemoryInfo(h).used),
    ),
    (
        "nv_gpu_power_usage",
        "GPU power usage in watts",
        _GAUGE,
        lambda nvml, h, _: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
    ),
    (
        "nv_gpu_power_limit",
        "GPU power management limit in watts",
        _GAUGE,
        # Triton's DCGM field POWER_MGMT_LIMIT: NVML's power management limit
        lambda nvml, h, _: nvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
    ),
    (
        "nv_energy_consumption",
        "GPU energy consumption in joules since the Triton Server started",
        _COUNTER,
        lambda nvml, h, start: _since(nvml.nvmlDeviceGetTotalEnergyConsumption(h), start),
    ),
)


def _since(energy: int, start: int | None) -> float:
    """Joules since `start` (mJ); left out (as an unsupported reading) before a first one."""
    if start is None:
        raise _NoReading
    return (energy - start) / 1000.0


class _NoReading(Exception):
    """No energy reading to count from yet."""


class GpuMetrics:
    """NVML, initialised for the life of the process, and the GPUs to report."""

    def __init__(self, devices: Sequence[GpuDevice]) -> None:
        self._nvml: Any = None
        # uuid, NVML handle, energy at the first reading that worked (mJ; None before one)
        self._gpus: list[list[Any]] = []
        self._lock = threading.Lock()
        if not devices:
            return
        try:
            import pynvml
        except ImportError:
            return  # devices come from NVML: not reached without it
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            log.info("GPU metrics: NVML is not available (%s)", exc)
            return
        self._nvml = pynvml
        for device in devices:
            if not device.readable:
                continue  # no handle to be had (gpu/devices.py said so)
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(device.nvml_index)
            except pynvml.NVMLError as exc:
                log.warning("GPU metrics: GPU %s cannot be read (%s)", device.uuid, exc)
                continue
            self._gpus.append([device.uuid, handle, self._energy(handle)])

    def _energy(self, handle: Any) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except self._nvml.NVMLError:
            return None  # counted from the first reading that works, as Triton counts

    def render(self) -> str:
        """The families' text, or "" without GPUs."""
        with self._lock:
            if self._nvml is None or not self._gpus:
                return ""
            lines: list[str] = []
            for gpu in self._gpus:
                if gpu[2] is None:
                    gpu[2] = self._energy(gpu[1])
            for name, help_text, kind, read in _FAMILIES:
                samples = []
                for uuid, handle, start in self._gpus:
                    try:
                        value = read(self._nvml, handle, start)
                    except (self._nvml.NVMLError, _NoReading):
                        continue  # not supported on this GPU, or no reading yet
                    samples.append(f'{name}{{gpu_uuid="{uuid}"}} {value:f}')
                if samples:
                    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
            return "\n".join(lines) + "\n" if lines else ""
