"""GPU models served through the triton door, called by tritonclient (gRPC and HTTP).

The repository (tests/repositories/gpu) is written the way Triton users write GPU models: torch
on `cuda:<model_instance_device_id>`, outputs given as CUDA tensors with `from_dlpack`, an
ensemble passing a CUDA tensor between steps, a decoupled model sending CUDA tensors from a
thread. Also: the registered config shows the GPU groups as loaded, and the metrics port has
Triton's GPU families.
"""

from __future__ import annotations

import base64
import json
import queue
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from model_repository_loader.gpu.devices import visible_devices

GPUS = len(visible_devices())


@pytest.fixture(scope="module")
def server(shared_bridge_server, repository):
    return shared_bridge_server(repository("gpu"), "--allow-client-shm")  # CUDA regions


def _inputs(module, a: np.ndarray, b: np.ndarray) -> list:
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_torch_model_answers_from_cuda_tensors(server, wire: str) -> None:
    module, url = (grpcclient, server.grpc_url) if wire == "grpc" else (httpclient, server.http_url)
    client = module.InferenceServerClient(url)
    a = np.arange(1 << 16, dtype=np.float32)
    b = np.full(1 << 16, 2.0, dtype=np.float32)
    devices = set()
    for _ in range(2 * max(GPUS, 1)):  # the default scheduler goes round every instance
        result = client.infer("torch_add_sub_gpu", _inputs(module, a, b))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        device_id, current, is_gpu = result.as_numpy("DEVICE").tolist()
        assert is_gpu == 1 and current == device_id  # the instance's GPU is current
        devices.add(device_id)
    assert devices == set(range(GPUS))  # one KIND_GPU instance per GPU


def test_the_config_carries_the_gpu_groups(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    config = client.get_model_config("torch_add_sub_gpu", as_json=True)["config"]
    groups = config["instance_group"]
    assert [(g["kind"], [int(x) for x in g["gpus"]]) for g in groups] == [
        ("KIND_GPU", list(range(GPUS)))
    ]


def test_an_ensemble_passes_a_cuda_tensor_between_steps(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.arange(8, dtype=np.float32)
    result = client.infer("gpu_ensemble", _inputs(grpcclient, a, a))
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + a)
    assert result.as_numpy("ON_GPU").tolist() == [True]  # no host copy between the steps


def test_a_decoupled_model_streams_cuda_tensors(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([5], np.int32))
        client.async_stream_infer("gpu_decoupled", [count], enable_empty_final_response=True)
        received = []
        while True:
            result, error = answers.get(timeout=60)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            if result.as_numpy("OUT") is not None:
                received.append(result.as_numpy("OUT").tolist())
            if final:
                break
        assert received == [[float(k)] * 4 for k in range(5)]
    finally:
        client.stop_stream()


def test_gpu_metrics_are_on_the_metrics_port(server) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as reply:
        text = reply.read().decode()
    for family in (
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_energy_consumption",
    ):
        samples = [line for line in text.splitlines() if line.startswith(family + "{")]
        assert len(samples) == GPUS, family
        assert all('gpu_uuid="GPU-' in line for line in samples)
    assert "# TYPE nv_energy_consumption counter" in text


def test_no_gpu_metrics_when_turned_off(bridge_server, repository) -> None:
    server = bridge_server(repository("gpu"), "--allow-gpu-metrics=false")
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as reply:
        assert "nv_gpu_" not in reply.read().decode()


def test_the_log_names_the_gpus(server) -> None:
    devices = visible_devices()
    assert all(device.uuid in server.log_text() for device in devices), json.dumps(
        [d.uuid for d in devices]
    )


@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_cuda_shared_memory_in_and_out(server, wire: str) -> None:
    import tritonclient.utils.cuda_shared_memory as cudashm

    module, url = (grpcclient, server.grpc_url) if wire == "grpc" else (httpclient, server.http_url)
    client = module.InferenceServerClient(url)
    a = np.arange(1024, dtype=np.float32)
    b = np.ones(1024, dtype=np.float32)
    size = a.nbytes
    regions = {
        name: cudashm.create_shared_memory_region(f"{wire}_{name}", nbytes, 0)
        for name, nbytes in (("in", 2 * size), ("out", size), ("small", size // 2))
    }
    try:
        cudashm.set_shared_memory_region(regions["in"], [a, b])
        for name, handle in regions.items():
            nbytes = 2 * size if name == "in" else size if name == "out" else size // 2
            client.register_cuda_shared_memory(
                f"{wire}_{name}", cudashm.get_raw_handle(handle), 0, nbytes
            )
        status = client.get_cuda_shared_memory_status()
        listed = status.regions if wire == "grpc" else {r["name"]: r for r in status}
        assert set(listed) == {f"{wire}_in", f"{wire}_out", f"{wire}_small"}

        inputs = _inputs(module, a, b)
        inputs[0].set_shared_memory(f"{wire}_in", size, 0)
        inputs[1].set_shared_memory(f"{wire}_in", size, size)
        out = module.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(f"{wire}_out", size)
        client.infer("torch_add_sub_gpu", inputs, outputs=[out])
        written = cudashm.get_contents_as_numpy(regions["out"], np.float32, [1024])
        np.testing.assert_array_equal(written, a + b)

        small = module.InferRequestedOutput("OUTPUT0")
        small.set_shared_memory(f"{wire}_small", size // 2)
        with pytest.raises(Exception) as info:
            client.infer("torch_add_sub_gpu", inputs, outputs=[small])
        assert f"should be at least {size} bytes to hold the results" in str(info.value)
    finally:
        client.unregister_cuda_shared_memory()
        for handle in regions.values():
            cudashm.destroy_shared_memory_region(handle)
    status = client.get_cuda_shared_memory_status()
    assert not (status.regions if wire == "grpc" else status)


@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_a_cuda_region_reaches_a_gpu_input_model_on_the_gpu(server, wire: str) -> None:
    """gpu_identity takes GPU inputs (FORCE_CPU_ONLY_INPUT_TENSORS "no"): its input, in a CUDA
    region, reaches `execute` as a GPU tensor, and its GPU output goes into a CUDA region."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    module, url = (grpcclient, server.grpc_url) if wire == "grpc" else (httpclient, server.http_url)
    client = module.InferenceServerClient(url)
    data = np.arange(4096, dtype=np.float32)
    regions = {
        name: cudashm.create_shared_memory_region(f"{wire}_gpu_{name}", data.nbytes, 0)
        for name in ("in", "out")
    }
    try:
        cudashm.set_shared_memory_region(regions["in"], [data])
        for name, handle in regions.items():
            client.register_cuda_shared_memory(
                f"{wire}_gpu_{name}", cudashm.get_raw_handle(handle), 0, data.nbytes
            )
        tensor = module.InferInput("IN", [data.size], "FP32")
        tensor.set_shared_memory(f"{wire}_gpu_in", data.nbytes)
        out = module.InferRequestedOutput("OUT")
        out.set_shared_memory(f"{wire}_gpu_out", data.nbytes)
        on_gpu = module.InferRequestedOutput("ON_GPU")
        result = client.infer("gpu_identity", [tensor], outputs=[out, on_gpu])
        assert result.as_numpy("ON_GPU").tolist() == [True]
        written = cudashm.get_contents_as_numpy(regions["out"], np.float32, [data.size])
        np.testing.assert_array_equal(written, data)
    finally:
        client.unregister_cuda_shared_memory()
        for handle in regions.values():
            cudashm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_a_cuda_region_registration_tritons_checks_refuse(server, wire: str) -> None:
    """Larger than the client's allocation, a device this server does not have, or a handle
    that opens nothing: INVALID_ARG with Triton's texts, and nothing registered."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    module, url = (grpcclient, server.grpc_url) if wire == "grpc" else (httpclient, server.http_url)
    client = module.InferenceServerClient(url)
    handle = cudashm.create_shared_memory_region(f"{wire}_checked", 4096, 0)
    raw = cudashm.get_raw_handle(handle)
    try:
        refused = f"failed to register shared memory region '{wire}_big': invalid args"
        for device, size in ((0, 4096 + 1), (GPUS, 4096)):  # too large; no such device
            with pytest.raises(Exception, match=refused):
                client.register_cuda_shared_memory(f"{wire}_big", raw, device, size)
        # A well-formed handle of memory that no process exported.
        forged = base64.b64encode(bytes(64))  # both clients take the handle in base64
        with pytest.raises(Exception, match="failed to register shared memory region"):
            client.register_cuda_shared_memory(f"{wire}_forged", forged, 0, 16)
        status = client.get_cuda_shared_memory_status()
        assert not (status.regions if wire == "grpc" else status)
        client.register_cuda_shared_memory(f"{wire}_fits", raw, 0, 4096)  # the same, fitting
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(handle)
