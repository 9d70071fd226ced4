"""The pb_utils module as a whole: names, install(), constants, helpers, context.

[V] = observed on Triton 2.51 with a probe model (spec §1.0, §1.1, §1.12).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from model_repository_loader import pb_utils
from model_repository_loader.pb_utils import TritonModelException, context

ROOT = Path(__file__).resolve().parents[2]

# [V] sorted(dir(triton_python_backend_utils)) without dunders, inside a 2.51 model.
TRITON_NAMES = [
    "InferenceRequest",
    "InferenceResponse",
    "Logger",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "json",
    "load_model",
    "np",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "struct",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
# [V] sorted(dir(c_python_backend_utils)) without dunders, inside a 2.51 model.
C_NAMES = [
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "MemoryType",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "PreferredMemory",
    "ResponseIterator",
    "SharedMemory",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "async_event_future_done_callback",
    "is_model_ready",
    "load_model",
    "shared_memory",
    "unload_model",
]


def test_every_triton_name_is_present() -> None:
    names = set(dir(pb_utils))
    assert [n for n in TRITON_NAMES + C_NAMES if n not in names] == []


def test_install_registers_both_module_names() -> None:
    pb_utils.install()
    pb_utils.install()  # idempotent
    assert importlib.import_module("triton_python_backend_utils") is pb_utils
    assert importlib.import_module("c_python_backend_utils") is pb_utils
    from triton_python_backend_utils import Tensor

    assert Tensor is pb_utils.Tensor
    assert sys.modules["c_python_backend_utils"].shared_memory.free_memory() == 0


def test_constants() -> None:
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    assert pb_utils.TRITONSERVER_MEMORY_GPU == pb_utils.MemoryType.TRITONSERVER_MEMORY_GPU


def test_triton_string_to_numpy() -> None:
    table = pb_utils.TRITON_STRING_TO_NUMPY
    assert table["TYPE_BOOL"] is bool  # Python's bool, not np.bool_
    assert table["TYPE_FP32"] is np.float32
    assert table["TYPE_STRING"] is np.object_
    assert len(table) == 13
    assert pb_utils.triton_string_to_numpy("TYPE_INT64") is np.int64
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_BF16")  # [V]


def test_type_code_helpers() -> None:
    assert pb_utils.triton_to_numpy_type(1) is np.bool_
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.triton_to_numpy_type(14) is None  # [V]
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.dtype("float32")) == 11  # [V]
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(bool) is None  # [V]
    assert pb_utils.numpy_to_triton_type(np.dtype("S3")) is None  # [V]
    assert pb_utils.numpy_to_triton_type("float32") is None  # [V]


def test_serialize_byte_tensor() -> None:
    # [V] all four results.
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=object)) == ()
    assert pb_utils.serialize_byte_tensor(np.array([1.0])) is None
    assert (
        pb_utils.serialize_byte_tensor(np.array([b"ab", 1, "c"], dtype=object))
        == b"\x02\x00\x00\x00ab\x01\x00\x00\x001\x01\x00\x00\x00c"
    )
    assert (
        pb_utils.serialize_byte_tensor(np.array([b"bb\x00", b"a"]))
        == b"\x02\x00\x00\x00bb\x01\x00\x00\x00a"
    )


def test_serialize_is_c_order() -> None:
    array = np.array([[b"a", b"b"], [b"c", b"d"]], dtype=object).T
    assert pb_utils.serialize_byte_tensor(array) == b"".join(
        b"\x01\x00\x00\x00" + x for x in (b"a", b"c", b"b", b"d")
    )


def test_deserialize_bytes_tensor() -> None:
    # [V] array([b'ab', b''], dtype=object) and array([], dtype=object)
    array = pb_utils.deserialize_bytes_tensor(b"\x02\x00\x00\x00ab\x00\x00\x00\x00")
    assert array.dtype == np.object_ and array.tolist() == [b"ab", b""]
    empty = pb_utils.deserialize_bytes_tensor(b"")
    assert empty.dtype == np.object_ and empty.shape == (0,)


def test_config_helpers() -> None:
    config = {
        "input": [{"name": "A", "data_type": "TYPE_FP32"}],
        "output": [{"name": "B", "data_type": "TYPE_STRING"}],
    }
    assert pb_utils.get_input_config_by_name(config, "A") == config["input"][0]
    assert pb_utils.get_input_config_by_name(config, "B") is None
    assert pb_utils.get_output_config_by_name(config, "B") == config["output"][0]
    assert pb_utils.get_output_config_by_name({}, "B") is None
    assert pb_utils.using_decoupled_model_transaction_policy(config) is False
    config["model_transaction_policy"] = {"decoupled": True}
    assert pb_utils.using_decoupled_model_transaction_policy(config) is True


def test_model_loading_api_not_supported_yet() -> None:
    with pytest.raises(TritonModelException, match="^Failed to load model: .*not supported yet"):
        pb_utils.load_model("zzz")
    with pytest.raises(TritonModelException, match="^Failed to unload model: .*not supported"):
        pb_utils.unload_model("zzz")
    with pytest.raises(TritonModelException, match="^Failed to check model readiness: "):
        pb_utils.is_model_ready("zzz")
    with pytest.raises(TypeError):
        pb_utils.load_model(None)


def test_model_loading_api_uses_the_calling_instances_control() -> None:
    calls = []

    class Control:
        def load_model(self, name: str, config: str, files: dict | None) -> None:
            calls.append(("load", name, config, files))

        def unload_model(self, name: str, unload_dependents: bool) -> None:
            calls.append(("unload", name, unload_dependents))

        def is_model_ready(self, name: str, version: str) -> bool:
            calls.append(("ready", name, version))
            return True

    services = pb_utils.ModelServices(control=Control())
    bound = pb_utils.context.ModelContext("m", "m_0", "", services)
    with pb_utils.context.model_context(context=bound):
        pb_utils.load_model("a", config="{}")
        pb_utils.unload_model("a", unload_dependents=True)
        assert pb_utils.is_model_ready("a", "1") is True
    services.retire()
    assert calls == [("load", "a", "{}", None), ("unload", "a", True), ("ready", "a", "1")]


# -- context --------------------------------------------------------------------------------------


def test_get_model_dir_follows_the_bound_instance() -> None:
    with context.model_context(model_name="m", instance_name="m_0", version_dir="/models/m/1"):
        assert pb_utils.get_model_dir() == "/models/m/1"  # [V] the version directory
        with context.model_context(model_name="n", instance_name="n_0", version_dir="/models/n/2"):
            assert pb_utils.get_model_dir() == "/models/n/2"
        assert pb_utils.get_model_dir() == "/models/m/1"


def run_fresh(code: str) -> None:
    """Run `code` in a new interpreter: these checks need a process where no other test has
    bound a model instance (module-scoped repositories of other test files stay loaded, and
    the context falls back to the only bound instance process-wide)."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_get_model_dir_without_a_model() -> None:
    run_fresh(
        """
        import pytest
        from model_repository_loader import pb_utils
        from model_repository_loader.pb_utils import TritonModelException, context

        assert context.current_model() is None
        with pytest.raises(TritonModelException):
            pb_utils.get_model_dir()
        """
    )


def test_threads_fall_back_to_the_only_bound_instance() -> None:
    run_fresh(
        """
        import threading
        from model_repository_loader import pb_utils
        from model_repository_loader.pb_utils import context

        assert not context._bound
        seen = []

        def worker():
            seen.append((pb_utils.get_model_dir(), context.current_phase()))

        with context.model_context(model_name="m", instance_name="m_0", version_dir="/models/m/1"):
            with context.phase("finalize"):
                thread = threading.Thread(target=worker)
                thread.start()
                thread.join()
        assert seen == [("/models/m/1", "finalize")], seen
        """
    )


def test_threads_get_no_fallback_with_two_instances() -> None:
    seen = []
    with context.model_context(model_name="m", instance_name="m_0", version_dir="/m/1"):
        other_bound = threading.Event()
        release = threading.Event()

        def other() -> None:
            with context.model_context(model_name="n", instance_name="n_0", version_dir="/n/1"):
                other_bound.set()
                release.wait()

        holder = threading.Thread(target=other)
        holder.start()
        other_bound.wait()
        probe = threading.Thread(target=lambda: seen.append(context.current_model()))
        probe.start()
        probe.join()
        release.set()
        holder.join()
    assert seen == [None]


def test_phases() -> None:
    with context.model_context(model_name="m", instance_name="m_0", version_dir="/m/1") as bound:
        with context.phase("initialize"):
            assert bound.phase == "initialize"
            assert not context.in_execute() and not context.bls_allowed()
        with context.phase("execute"):
            assert context.in_execute() and context.bls_allowed()
        assert bound.phase is None
    with pytest.raises(ValueError):
        context.phase("run")
