"""The GPUs a model can use, and GPU memory as Triton's Python backend hands it to models.

- `devices.py`: which GPUs this host offers, through NVML (no CUDA context is made, so process
  instances started later still get a clean device), in CUDA's numbering under
  `CUDA_VISIBLE_DEVICES`, filtered by `--min-supported-compute-capability` as Triton filters.
- `cuda.py`: the few CUDA calls the loader makes (copies, the current device, streams, IPC
  handles), and which of two implementations makes them in this process: `bindings.py`
  (NVIDIA's `cuda-bindings`) or `libcuda.py` (the driver's own library through ctypes, for an
  environment without the bindings); `errors.py`, their errors. Nothing is loaded until GPU
  memory is touched.
- `device_array.py`: `DeviceArray`, a tensor's memory on a GPU (a producer's DLPack memory, or
  memory the loader allocated), held until every holder is done.

Neither NVML nor CUDA is a dependency of a CPU install (`pip install .[gpu]` brings them). A
host without either behaves exactly as a CPU-only Triton host.
"""
