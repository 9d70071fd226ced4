"""Triton's own `qa/L0_backend_python` tests, unmodified, against the bridge's triton door.

Each qa folder's models are laid out as its `test.sh` lays them out (the `_layout_*`
functions: its `cp` and `sed` lines, in Python), one server per test.sh server start serves them
(`PHASES`; in a network namespace of its own, on Triton's ports, with the flags of test.sh's
SERVER_ARGS that the bridge has), and the folder's test file runs there with pytest as test.sh
runs it. Every upstream test case is a test of ours that passes when the upstream case passed,
and so is each check test.sh makes on the server's log (model log lines, not Triton's own).
A case that cannot run here is skipped by name (`SKIPPED`; left out of the upstream run too); a
case that fails for a known gap in the bridge is `xfail(strict=True)` with the reason
(`KNOWN_GAPS`), so it turns red once fixed. README.md says which folders run and why the others
do not.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness.gpu import gpu_missing
from tests.upstream.qa_support import (
    CASE_TIMEOUT_S,
    Layout,
    Phase,
    PhaseRun,
    Step,
    run_phase,
    upstream_cases,
)
from tests.upstream.support import unpack

# ---------------------------------------------------------------------------------------------
# Layouts: each test.sh's `mkdir -p models/…; cp …; sed -i …; echo … >> config.pbtxt`.


def _layout_decoupled(layout: Layout) -> None:
    # decoupled/models/ already holds the folder's own models; test.sh adds these to them.
    layout.model("identity_fp32")
    cancel = layout.model("execute_cancel")
    layout.append(cancel, "model_transaction_policy { decoupled: True }")
    layout.model("response_sender_until_cancelled")
    examples = layout.python_models.parents[2] / "python_backend" / "examples" / "decoupled"
    square = layout.models / "square_int32"
    (square / "1").mkdir(parents=True, exist_ok=True)
    (square / "1" / "model.py").write_bytes((examples / "square_model.py").read_bytes())
    (square / "config.pbtxt").write_bytes((examples / "square_config.pbtxt").read_bytes())
    layout.model("dlpack_add_sub")


def _layout_lifecycle(layout: Layout) -> None:
    layout.model("error_code")
    layout.model("execute_cancel")
    execute_error = layout.model("execute_error")
    layout.set_line(execute_error, "name", '"execute_error"')
    layout.set_line(execute_error, "max_batch_size", "8")
    layout.append(
        execute_error,
        "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }",
    )
    grpc_error = layout.model("execute_grpc_error")
    layout.set_line(grpc_error, "name", '"execute_grpc_error"')
    layout.set_line(grpc_error, "max_batch_size", "8")
    layout.append(
        grpc_error,
        "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 1200000 }",
    )
    layout.model("decoupled_grpc_error")
    layout.model("execute_return_error")
    wrong = layout.model("wrong_model")
    layout.set_line(wrong, "name", '"wrong_model"')
    layout.replace_all(wrong, "TYPE_FP32", "TYPE_UINT32")


def _layout_init_error(layout: Layout) -> None:
    layout.model("init_error")


def _layout_fini_error(layout: Layout) -> None:
    layout.model("fini_error")


def _layout_auto_complete_error(layout: Layout) -> None:
    layout.model("auto_complete_error", config=False)


def _log_has(text: str) -> Callable[[PhaseRun], None]:
    """test.sh's `grep "TEXT" $SERVER_LOG`; `{folder}` in TEXT is the qa folder (its `pwd`)."""

    def check(run: PhaseRun) -> None:
        wanted = text.format(folder=run.folder.resolve())
        log = run.server_log
        assert wanted in log, f"{wanted!r} is not in the server log:\n{log[-6000:]}"

    return check


def _layout_parameters(layout: Layout) -> None:
    for name in ("response_parameters", "response_parameters_decoupled", "response_parameters_bls"):
        layout.model(name)


def _layout_async_execute(layout: Layout) -> None:
    layout.model("async_execute_decouple")
    layout.model("async_execute_decouple_bls")


def _layout_bls(layout: Layout) -> None:
    # The GPU / ONNX / libtorch part of bls/test.sh: its steps are all skipped (SKIPPED), so
    # this server is never started; the layout is here for the record of what test.sh serves.
    for name in ("bls", "dlpack_add_sub", "bls_async", "bls_memory", "bls_memory_async"):
        layout.model(name)
    for name in ("add_sub", "execute_error", "identity_fp32", "dlpack_identity"):
        layout.model(name)


def _layout_bls_init_error(layout: Layout) -> None:
    layout.model("bls_init_error")


def _layout_bls_finalize_error(layout: Layout) -> None:
    layout.model("bls_finalize_error")


def _layout_bls_parameters(layout: Layout) -> None:
    layout.model("bls_parameters")


def _layout_response_sender(layout: Layout) -> None:
    decoupled = "model_transaction_policy { decoupled: True }"
    batching = "dynamic_batching { max_queue_delay_microseconds: 500000 }"
    for name, model_file, extra in (
        ("response_sender", "model.py", ()),
        ("response_sender_decoupled", "model.py", (decoupled,)),
        ("response_sender_async", "model_async.py", ()),
        ("response_sender_decoupled_async", "model_async.py", (decoupled,)),
        ("response_sender_batching", "model.py", (batching,)),
        ("response_sender_decoupled_batching", "model.py", (decoupled, batching)),
        ("response_sender_async_batching", "model_async.py", (batching,)),
        ("response_sender_decoupled_async_batching", "model_async.py", (decoupled, batching)),
    ):
        model = layout.model(
            "response_sender", name, model_file=model_file, extra_files=("model_common.py",)
        )
        for line in extra:
            layout.append(model, line)


def _layout_response_sender_complete_final(layout: Layout) -> None:
    layout.model("response_sender_complete_final")


def _layout_request_rescheduling(layout: Layout) -> None:
    for name in (
        "bls_request_rescheduling",
        "request_rescheduling_addsub",
        "iterative_sequence",
        "wrong_return_type",
    ):
        layout.model(name)


def _layout_argument_validation(layout: Layout) -> None:
    pass  # argument_validation/models/ ships with the folder


def _layout_model_control(layout: Layout) -> None:
    layout.model("identity_fp32")
    ensemble = layout.models / "simple_identity_fp32"
    (ensemble / "1").mkdir(parents=True, exist_ok=True)
    config = layout.python_models / "simple_identity_fp32" / "config.pbtxt"
    (ensemble / "config.pbtxt").write_bytes(config.read_bytes())


def _layout_ensemble(layout: Layout) -> None:
    ensemble = layout.models / "ensemble"
    (ensemble / "1").mkdir(parents=True, exist_ok=True)
    config = layout.python_models / "ensemble" / "config.pbtxt"
    (ensemble / "config.pbtxt").write_bytes(config.read_bytes())
    layout.model("add_sub", "add_sub_1")
    layout.model("add_sub", "add_sub_2")
    # ensemble_gpu and its libtorch step (from Triton's qa data, not in the archive) are left
    # out with test_ensemble_gpu (SKIPPED).


def _layout_io_requested_output(layout: Layout) -> None:
    layout.model("add_sub")
    layout.model("dlpack_io_identity_decoupled")


def _layout_io_prior_crash(layout: Layout) -> None:
    llm = layout.models / "llm"
    (llm / "1").mkdir(parents=True, exist_ok=True)
    source = layout.python_models.parent / "L0_backend_python" / "io" / "requested_output_model"
    (llm / "config.pbtxt").write_bytes((source / "config.pbtxt").read_bytes())
    (llm / "1" / "model.py").write_bytes((source / "model.py").read_bytes())


def _layout_io_gpu(*models: str) -> Callable[[Layout], None]:
    def layout_models(layout: Layout) -> None:
        for model in models:
            layout.model(model)

    return layout_models


def _layout_python_test(layout: Layout) -> None:
    """The top-level L0_backend_python/test.sh's first server (python_test.py)."""
    identity = layout.model("identity_fp32")
    layout.model("identity_bf16")
    uint8 = layout.copy_tree(identity, "identity_uint8")
    layout.set_line(uint8, "name", '"identity_uint8"')
    layout.replace_all(uint8, "TYPE_FP32", "TYPE_UINT8")
    layout.set_line(uint8, "max_batch_size", "8")
    layout.append(
        uint8,
        "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }",
    )
    uint8_nobatch = layout.copy_tree(identity, "identity_uint8_nobatch")
    layout.set_line(uint8_nobatch, "name", '"identity_uint8_nobatch"')
    layout.replace_all(uint8_nobatch, "TYPE_FP32", "TYPE_UINT8")
    layout.set_line(uint8_nobatch, "max_batch_size", "")
    uint32 = layout.copy_tree(identity, "identity_uint32")
    layout.set_line(uint32, "name", '"identity_uint32"')
    layout.replace_all(uint32, "TYPE_FP32", "TYPE_UINT32")
    boolean = layout.copy_tree(identity, "identity_bool")
    layout.set_line(boolean, "name", '"identity_bool"')
    layout.replace_all(boolean, "TYPE_FP32", "TYPE_BOOL")
    default_name = layout.copy_tree(identity, "default_model_name")
    (default_name / "1" / "model.py").rename(default_name / "1" / "mymodel.py")
    layout.set_line(default_name, "name", '"default_model_name"')
    layout.append(default_name, 'default_model_filename: "mymodel.py"')
    pytorch = layout.model("pytorch_fp32_fp32")
    layout.set_line(pytorch, "name", '"pytorch_fp32_fp32"')
    for name in ("delayed_model", "init_args", "optional", "non_contiguous", "string"):
        layout.model(name)
    # `sed "s|TRITON_DIR_PATH|${TRITON_DIR}|"`; TRITON_DIR is the unpacked server/ (Phase.env)
    init_args = layout.models / "init_args"
    layout.replace_all(init_args, "TRITON_DIR_PATH", str(layout.python_models.parents[1]))
    layout.model("string_fixed")
    layout.model("dlpack_identity")


def _layout_custom_metrics(layout: Layout) -> None:
    layout.model("custom_metrics")


def _layout_logging(layout: Layout) -> None:
    layout.model("identity_fp32_logging")


def _layout_non_existent_model(layout: Layout) -> None:
    """The top-level test.sh's last two servers: a model folder with a config and no model.py."""
    model = layout.models / "non_existent_model"
    (model / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(layout.python_models / "identity_fp32" / "config.pbtxt", model / "config.pbtxt")
    layout.set_line(model, "name", '"non_existent_model"')


def _layout_model_readiness_signal(layout: Layout) -> None:
    layout.model("identity_fp32")


def _layout_model_readiness(layout: Layout) -> None:
    """model_readiness/test.sh's setup_readiness_test_model and the decoupled model."""
    identity = layout.model("identity_fp32")
    test_models = layout.models.parent / "test_models"
    for name, return_value, delay in (
        ("is_ready_fn_returns_true", "true", "0.1"),
        ("is_ready_fn_returns_false", "false", "0.1"),
        ("is_ready_fn_raises_error", "exception", "0.1"),
        ("is_ready_fn_returns_non_boolean", "non_boolean", "0.1"),
        ("is_ready_fn_timeout", "true", "8"),
        ("is_ready_fn_coroutine_returns_true", "coroutine", "0.1"),
    ):
        model = layout.models / name
        (model / "1").mkdir(parents=True, exist_ok=True)
        source = (
            "readiness_coroutine_model.py"
            if name == "is_ready_fn_coroutine_returns_true"
            else "readiness_model.py"
        )
        shutil.copyfile(test_models / source, model / "1" / "model.py")
        shutil.copyfile(identity / "config.pbtxt", model / "config.pbtxt")
        layout.set_line(model, "name", f'"{name}"')
        with open(model / "config.pbtxt", "a") as config:  # its `cat >> config.pbtxt << EOF`
            config.write(
                'parameters: {\n  key: "READINESS_FN_RETURN_VALUE"\n'
                f'  value: {{ string_value: "{return_value}" }}\n}}\n'
                'parameters: {\n  key: "READINESS_FN_DELAY_SECS"\n'
                f'  value: {{ string_value: "{delay}" }}\n}}\n'
            )
    decoupled = layout.models / "is_ready_fn_returns_true_decoupled"
    (decoupled / "1").mkdir(parents=True, exist_ok=True)
    source_folder = test_models / "is_ready_fn_returns_true_decoupled"
    shutil.copyfile(source_folder / "model.py", decoupled / "1" / "model.py")
    shutil.copyfile(source_folder / "config.pbtxt", decoupled / "config.pbtxt")


# env/test.sh's Zip Slip part: mode -> the text its server log must hold.
ZIPSLIP_CASES = {"relative": "Path contains '..'", "absolute": "Path is absolute"}


def _zipslip_marker(mode: str) -> Path:
    """test.sh's `/tmp/zipslip_${mode}_marker_$$`: where a vulnerable server would write."""
    return Path(f"/tmp/zipslip_{mode}_marker_{os.getpid()}")


def _layout_zipslip(mode: str) -> Callable[[Layout], None]:
    def layout_model(layout: Layout) -> None:
        name = f"zipslip_{mode}"
        model = layout.model("identity_fp32", name)
        layout.set_line(model, "name", f'"{name}"')
        layout.append(
            model,
            'parameters: {key: "EXECUTION_ENV_PATH", value: {string_value: '
            '"$$TRITON_MODEL_DIRECTORY/malicious_env.tar.gz"}}',
        )
        marker = _zipslip_marker(mode)
        marker.unlink(missing_ok=True)
        # test.sh's `python3 ./zipslip_test.py --mode … --output … --marker …`
        subprocess.run(
            [
                sys.executable,
                "./zipslip_test.py",
                "--mode",
                mode,
                "--output",
                str(model / "malicious_env.tar.gz"),
                "--marker",
                str(marker),
            ],
            cwd=layout.models.parent,
            check=True,
            capture_output=True,
        )

    return layout_model


def _no_marker(mode: str) -> Callable[[PhaseRun], None]:
    """env/test.sh's `[ -e "${marker}" ]`: nothing was written outside the extraction folder."""

    def check(run: PhaseRun) -> None:
        marker = _zipslip_marker(mode)
        written = marker.exists()
        marker.unlink(missing_ok=True)
        assert not written, f"{marker} was written: the archive escaped its folder"

    return check


def _layout_l0_parameters(layout: Layout) -> None:
    """qa/L0_parameters' model_repository, its Python model only: `identity` (backend
    "identity") and `ensemble` (over it) need Triton's identity backend (SKIPPED)."""
    shipped = layout.models.parent / "model_repository" / "parameter"
    shutil.copytree(shipped, layout.models / "parameter", dirs_exist_ok=True)


def _layout_class_count(layout: Layout) -> None:
    layout.model("identity_fp32")
    identity_bytes = layout.model("identity_fp32", "identity_bytes")
    layout.replace_all(identity_bytes, "identity_fp32", "identity_bytes")
    layout.replace_all(identity_bytes, "TYPE_FP32", "TYPE_STRING")


# qa/L0_simple_ensemble/test.sh: its models are made from backpressure_test_models/ and
# python_models/{ground_truth,join_add_sub}.
# Its `cat >> config.pbtxt << 'EOF'` of a queue bound.
QUEUE_POLICY = """
dynamic_batching {{
  preferred_batch_size: [ 1 ]
  default_queue_policy {{
    max_queue_size: {size}
  }}
}}"""


def _backpressure_models(layout: Layout) -> Path:
    return layout.models.parent / "backpressure_test_models"


def _producer(layout: Layout, name: str, queue_size: int = 0) -> Path:
    """`cp backpressure_test_models/decoupled_producer/… NAME/`, renamed, with a queue bound."""
    model = layout.copy_tree(_backpressure_models(layout) / "decoupled_producer", name)
    layout.replace_all(model, 'name: "decoupled_producer"', f'name: "{name}"')
    if queue_size:
        layout.append(model, QUEUE_POLICY.format(size=queue_size))
    return model


def _slow_consumer(layout: Layout, name: str, queue_size: int = 0) -> Path:
    """`cp python_models/ground_truth/… NAME/`, renamed, max_batch_size 1, a queue bound."""
    model = layout.model("ground_truth", name)
    layout.replace_all(model, 'name: "ground_truth"', f'name: "{name}"')
    layout.replace_all(model, "max_batch_size: 64", "max_batch_size: 1")
    if queue_size:
        layout.append(model, QUEUE_POLICY.format(size=queue_size))
    return model


def _ensemble_from(layout: Layout, name: str, old: str = "", new: str = "") -> Path:
    """`cp backpressure_test_models/ensemble_disabled_max_inflight_requests/config.pbtxt`."""
    model = layout.models / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    shipped = _backpressure_models(layout) / "ensemble_disabled_max_inflight_requests"
    shutil.copyfile(shipped / "config.pbtxt", model / "config.pbtxt")
    if old:
        layout.replace_all(model, old, new)
    return model


def _layout_step_max_queue_size(layout: Layout) -> None:
    _ensemble_from(
        layout,
        "ensemble_step1_enabled_max_queue_size",
        '"decoupled_producer"',
        '"decoupled_producer_enabled_max_queue_size"',
    )
    _slow_consumer(layout, "slow_consumer")
    _producer(layout, "decoupled_producer_enabled_max_queue_size", queue_size=4)
    _ensemble_from(
        layout,
        "ensemble_step2_enabled_max_queue_size",
        '"slow_consumer"',
        '"slow_consumer_enabled_max_queue_size"',
    )
    _producer(layout, "decoupled_producer")
    _slow_consumer(layout, "slow_consumer_enabled_max_queue_size", queue_size=4)


def _heredoc(layout: Layout, opener: str, within: str = "", **variables: str) -> str:
    """The here-document of qa/L0_simple_ensemble/test.sh whose `cat` line ends with
    `opener` (the first after the line `within`, a shell function's), with its `${NAME}`
    variables given."""
    lines = (layout.models.parent / "test.sh").read_text().splitlines()
    first = lines.index(within) if within else 0
    start = next(i for i, line in enumerate(lines) if i > first and line.rstrip().endswith(opener))
    end = lines.index("EOF", start + 1)
    text = "\n".join(lines[start + 1 : end]) + "\n"
    for name, value in variables.items():
        text = text.replace(f"${{{name}}}", value)
    return text


def _layout_parallel_failed_enqueue(layout: Layout) -> None:
    producer = _producer(layout, "decoupled_producer_parallel_queue")
    model_file = producer / "1" / "model.py"  # its `sed -i 's/0.5/2.0/g' model.py`
    model_file.write_text(model_file.read_text().replace("0.5", "2.0"))
    _slow_consumer(layout, "slow_consumer_queue_limited", queue_size=1)
    fast = _slow_consumer(layout, "fast_consumer")
    model_file = fast / "1" / "model.py"  # its `sed -i 's/time.sleep(delay)/time.sleep(0)/g'`
    model_file.write_text(model_file.read_text().replace("time.sleep(delay)", "time.sleep(0)"))
    layout.model("join_add_sub")
    ensemble = layout.models / "ensemble_parallel_step_failed_enqueue"
    (ensemble / "1").mkdir(parents=True, exist_ok=True)
    opener = "ensemble_parallel_step_failed_enqueue/config.pbtxt << 'EOF'"
    (ensemble / "config.pbtxt").write_text(_heredoc(layout, opener))


def _layout_ensemble_backpressure(layout: Layout) -> None:
    """test.sh's decoupled_producer (batch size 2), generate_consumer_model and
    generate_ensemble_model, written as its heredocs write them."""
    producer = _producer(layout, "decoupled_producer")
    layout.replace_all(producer, "max_batch_size: 1", "max_batch_size: 2")
    for name, delay in (("consumer_high_delay", "0.5"), ("consumer_low_delay", "0.1")):
        (layout.models / name / "1").mkdir(parents=True, exist_ok=True)
        within = "generate_consumer_model() {"
        model = _heredoc(layout, "${name}/1/model.py << EOF", within, delay=delay)
        (layout.models / name / "1" / "model.py").write_text(model)
        config = _heredoc(layout, "${name}/config.pbtxt << EOF", within, name=name)
        (layout.models / name / "config.pbtxt").write_text(config)
    limits = {"ensemble_disabled": "", "ensemble_limit_1": "1", "ensemble_limit_4": "4"}
    for name, limit in limits.items():
        (layout.models / name / "1").mkdir(parents=True, exist_ok=True)
        limit_str = f"max_inflight_requests: {limit}" if limit else ""
        within = "generate_ensemble_model() {"
        opener = "${name}/config.pbtxt << EOF"
        text = _heredoc(layout, opener, within, name=name, batch_size="2", limit_str=limit_str)
        (layout.models / name / "config.pbtxt").write_text(text)


def _layout_invalid_max_inflight(layout: Layout) -> None:
    _producer(layout, "decoupled_producer")
    _slow_consumer(layout, "slow_consumer")
    for name, value in (
        ("ensemble_invalid_negative_limit", "-5"),
        ("ensemble_invalid_string_limit", '"invalid_value"'),
        ("ensemble_invalid_large_value_limit", "12345678901"),
    ):
        _ensemble_from(
            layout,
            name,
            "ensemble_scheduling {",
            f"ensemble_scheduling {{\n  max_inflight_requests: {value}",
        )


# ---------------------------------------------------------------------------------------------
# test.sh's checks on the server log after it stopped.


def _log_counts(non_verbose: int, verbose: int) -> Callable[[PhaseRun], None]:
    """logging/test.sh's verify_log_counts: how many of the model's messages of each level."""

    def check(run: PhaseRun) -> None:
        log = run.server_log
        counts = {
            message: len(re.findall(re.escape(message), log))
            for message in ("Specific Msg!", "Info Msg!", "Warning Msg!", "Error Msg!")
        }
        counts["Verbose Msg!"] = log.count("Verbose Msg!")
        expected = {message: non_verbose for message in counts} | {"Verbose Msg!": verbose}
        assert counts == expected, log[-6000:]

    return check


def _decoupled_log_counts(run: PhaseRun) -> None:
    """decoupled/test.sh's verify_log_counts (non-Windows)."""
    log = run.server_log
    for message in ("Specific Msg!", "Info Msg!", "Warning Msg!", "Error Msg!"):
        assert message in log, f"{message!r} not in the server log:\n{log[-6000:]}"
    assert log.count("Finalize invoked") == 3, log[-6000:]
    assert log.count("Finalize complete...") == 3, log[-6000:]


def _curl_logging(settings: str) -> str:
    return f"curl -s -f -d '{settings}' http://localhost:8000/v2/logging"


# ---------------------------------------------------------------------------------------------
# One Phase per server test.sh starts (the ones whose every case is skipped are not started).


def _shm_leak(label: str, model: str, case_timeout: int = CASE_TIMEOUT_S) -> Step:
    """`MODEL_NAME=… pytest ../test_infer_shm_leak.py`: the model runs its own unittest."""
    return Step(
        label, "../test_infer_shm_leak.py", env={"MODEL_NAME": model}, case_timeout=case_timeout
    )


BLS_MEMORY_LIMIT = 14 * 2**30
# EnsembleBackpressureTest's cases of minutes: 16 requests of 8 responses through a consumer
# that sleeps 0.5 s a request, for each of three ensembles (~190 s, in Triton too), and 16
# requests in a row (~65 s).
# model_readiness's test_is_ready_takes_long_time: ten rounds of a 5 s readiness check that times
# out and the 8 s is_ready() it then waits for (~80 s, in Triton too).
READINESS_MINUTES = ("TestUserDefinedModelReadinessFunction::test_is_ready_takes_long_time",)
BACKPRESSURE_MINUTES = (
    "test_concurrent_requests_with_different_limits",
    "test_sequential_requests_limiter_resets_cleanly",
)
BLS_OUTSIDE_EXECUTE = "BLS is only supported during the 'execute' function."

PHASES = [
    Phase(
        "python_test",
        "",
        _layout_python_test,
        [Step("python_test", "python_test.py")],
        server_log="inference_server.log",
        env={"TRITON_DIR": "{root}/server"},
        # Its CUDA shared memory cases register regions: 2.58 allowed that by default; the
        # bridge follows Triton 2.70 on (off by default), whose test.sh passes this flag.
        server_args=("--log-verbose=1", "--allow-client-shm"),
    ),
    Phase(
        "decoupled",
        "decoupled",
        _layout_decoupled,
        [Step("decoupled", "decoupled_test.py")],
        server_log="decoupled_server.log",
        log_checks={"verify_log_counts": _decoupled_log_counts},
        fresh_models=False,
    ),
    Phase(
        "lifecycle",
        "lifecycle",
        _layout_lifecycle,
        # test.sh runs lifecycle_test.py five times on one server; once here, to bound the time.
        [Step("lifecycle", "lifecycle_test.py")],
        server_log="lifecycle_server.log",
    ),
    # lifecycle/test.sh's three servers that must report a model's Python error in its log
    # (test.sh also counts /dev/shm entries around them, Triton's stub regions: not here).
    Phase(
        "lifecycle_init_error",
        "lifecycle",
        _layout_init_error,
        [],
        server_log="lifecycle_server.log",
        log_checks={"grep init_error": _log_has("name 'lorem_ipsum' is not defined")},
        # tritonserver's default; the bridge's is false (test.sh waits for the server to exit)
        server_args=("--log-verbose=1", "--exit-on-error=true"),
        expect_ready=False,
    ),
    Phase(
        "lifecycle_fini_error",
        "lifecycle",
        _layout_fini_error,
        [],
        server_log="lifecycle_server.log",
        log_checks={"grep fini_error": _log_has("name 'undefined_variable' is not defined")},
    ),
    Phase(
        "lifecycle_auto_complete_error",
        "lifecycle",
        _layout_auto_complete_error,
        [],
        server_log="lifecycle_server.log",
        server_args=("--log-verbose=1", "--strict-model-config=false", "--exit-on-error=true"),
        log_checks={
            "grep auto_complete_error": _log_has("name 'undefined_variable' is not defined")
        },
        expect_ready=False,
    ),
    Phase(
        "parameters",
        "parameters",
        _layout_parameters,
        [Step("parameters", "response_parameters_test.py")],
    ),
    Phase(
        "async_execute",
        "async_execute",
        _layout_async_execute,
        [Step("async_execute", "concurrency_test.py", env={"SERVER_LOG": "server.log"})],
    ),
    *(
        Phase(
            f"bls_{kind}",
            "bls",
            _layout_bls,
            [_shm_leak(f"bls[{model},{kind}]", model, case_timeout=300) for model in BLS_MODELS],
            env={"BLS_KIND": kind},
            # bls_memory sends a 256 Mi-element tensor through BLS (1 GiB as FP32, made from
            # a 2 GiB float64 array): bounded, so that a copy too many fails instead of
            # filling the machine.
            memory_limit=BLS_MEMORY_LIMIT,
        )
        for kind in ("non_decoupled", "decoupled")
        for BLS_MODELS in [("bls", "bls_memory", "bls_memory_async", "bls_async")]
    ),
    # bls/test.sh: BLS outside execute() fails with this text in the log, at start-up
    # (initialize: the server does not start) and at shut-down (finalize).
    Phase(
        "bls_init_error",
        "bls",
        _layout_bls_init_error,
        [],
        server_args=("--log-verbose=1", "--exit-on-error=true"),  # tritonserver's default
        log_checks={"grep bls_init_error": _log_has(BLS_OUTSIDE_EXECUTE)},
        expect_ready=False,
    ),
    Phase(
        "bls_finalize_error",
        "bls",
        _layout_bls_finalize_error,
        [],
        log_checks={"grep bls_finalize_error": _log_has(BLS_OUTSIDE_EXECUTE)},
    ),
    Phase(
        "bls_parameters",
        "bls",
        _layout_bls_parameters,
        [Step("bls_parameters", "bls_parameters_test.py")],
    ),
    Phase(
        "response_sender",
        "response_sender",
        _layout_response_sender,
        [Step("response_sender", "response_sender_test.py", env={"SERVER_LOG": "server.log"})],
    ),
    Phase(
        "response_sender_complete_final",
        "response_sender",
        _layout_response_sender_complete_final,
        [
            Step(
                "response_sender_complete_final",
                "response_sender_complete_final_test.py",
                env={"SERVER_LOG": "server.log"},
            )
        ],
    ),
    Phase(
        "request_rescheduling",
        "request_rescheduling",
        _layout_request_rescheduling,
        [
            _shm_leak("request_rescheduling[bls_request_rescheduling]", "bls_request_rescheduling"),
            Step("request_rescheduling_grpc", "grpc_endpoint_test.py"),
        ],
        server_args=("--model-control-mode=explicit", "--load-model=*", "--log-verbose=1"),
    ),
    Phase(
        "argument_validation",
        "argument_validation",
        _layout_argument_validation,
        [_shm_leak("argument_validation", "argument_validation")],
        fresh_models=False,
    ),
    Phase(
        "model_control",
        "model_control",
        _layout_model_control,
        [Step("model_control", "model_control_test.py")],
        server_args=("--model-control-mode=explicit", "--log-verbose=1"),
    ),
    Phase("ensemble", "ensemble", _layout_ensemble, [Step("ensemble", "ensemble_test.py")]),
    Phase(
        "io_requested_output",
        "io",
        _layout_io_requested_output,
        [
            Step(
                f"io[{case}]",
                "io_test.py",
                select=(f"IOTest::{case}",),
            )
            for case in ("test_requested_output_default", "test_requested_output_decoupled")
        ],
    ),
    Phase(
        "io_prior_crash",
        "io",
        _layout_io_prior_crash,
        [
            Step(
                "io[test_requested_output_decoupled_prior_crash]",
                "io_test.py",
                select=("IOTest::test_requested_output_decoupled_prior_crash",),
            )
        ],
    ),
    *(
        Phase(
            f"io_ensemble_io_{trial}",
            "io",
            _layout_io_gpu(),
            [
                Step(
                    f"io[test_ensemble_io,{trial}]",
                    "io_test.py",
                    env={"TRIAL": trial},
                    select=("IOTest::test_ensemble_io",),
                )
            ],
        )
        for trial in ("default", "decoupled")
    ),
    *(
        Phase(
            f"io_{case}",
            "io",
            _layout_io_gpu(model),
            [Step(f"io[{case}]", "io_test.py", select=(f"IOTest::{case}",))],
        )
        for case, model in (
            ("test_empty_gpu_output", "dlpack_empty_output"),
            ("test_variable_gpu_output", "variable_gpu_output"),
        )
    ),
    Phase(
        "custom_metrics",
        "custom_metrics",
        _layout_custom_metrics,
        [_shm_leak("custom_metrics", "custom_metrics")],
    ),
    Phase(
        "logging_default",
        "logging",
        _layout_logging,
        [Step("logging[default]", "logging_test.py")],
        server_log="logging_server.log",
        server_args=(),  # test.sh starts this server without --log-verbose
        log_checks={"verify_log_counts 4 0": _log_counts(4, 0)},
    ),
    Phase(
        "logging_verbose",
        "logging",
        _layout_logging,
        [Step("logging[verbose]", "logging_test.py")],
        server_log="logging_server.log",
        server_args=(),  # test.sh starts this server without --log-verbose
        log_checks={"verify_log_counts 4 3": _log_counts(4, 3)},
        before=(_curl_logging('{"log_verbose_level":1}'),),
    ),
    Phase(
        "logging_disabled",
        "logging",
        _layout_logging,
        [Step("logging[disabled]", "logging_test.py")],
        server_log="logging_server.log",
        server_args=(),  # test.sh starts this server without --log-verbose
        log_checks={"verify_log_counts 1 0": _log_counts(1, 0)},
        before=tuple(
            _curl_logging(f'{{"{flag}":false}}')
            for flag in ("log_info", "log_warning", "log_error")
        ),
    ),
    # The top-level test.sh's last two servers: a model folder without model.py must fail the
    # start with these two texts (test.sh's `run_server` expects no ready server; the bridge
    # exits as tritonserver does with its default --exit-on-error=true).
    *(
        Phase(
            f"non_existent_model{suffix}",
            "",
            _layout_non_existent_model,
            [],
            server_log=f"non_existent_model_server{suffix}.log",
            server_args=("--log-verbose=1", *flags, "--exit-on-error=true"),
            log_checks={
                "grep ERROR_MESSAGE_1": _log_has(
                    "Failed to preinitialize Python stub: Python model file not found in "
                    "'{folder}/models/non_existent_model/1/model.py'"
                ),
                "grep ERROR_MESSAGE_2": _log_has("failed to load 'non_existent_model'"),
            },
            expect_ready=False,
        )
        for suffix, flags in (
            ("", ()),
            ("_auto_config_disabled", ("--disable-auto-complete-config",)),
        )
    ),
    # model_readiness/test.sh: its signal part (once; test.sh runs it for signals 11 and 9),
    # then every is_ready() model on one server with --strict-readiness=false.
    Phase(
        "model_readiness_signal",
        "model_readiness",
        _layout_model_readiness_signal,
        [
            Step(
                "model_readiness[signal]",
                "test_model_readiness.py",
                select=("TestModelReadiness",),
            )
        ],
        server_log="model_readiness_signal_11_server.log",
    ),
    # ... (its case of minutes, READINESS_MINUTES, on a server of its own in the heavy step)
    *(
        Phase(
            f"model_readiness{suffix}",
            "model_readiness",
            _layout_model_readiness,
            [
                Step(
                    f"model_readiness{suffix}",
                    "test_model_readiness.py",
                    select=cases,
                    case_timeout=150,
                )
            ],
            server_args=("--log-verbose=1", "--strict-readiness=false"),
            server_log="test_user_defined_model_readiness_function_server.log",
        )
        for suffix, cases in (
            (
                "",
                tuple(
                    case
                    for case in upstream_cases("model_readiness/test_model_readiness.py")
                    if case.startswith("TestUserDefinedModelReadinessFunction::")
                    and case not in READINESS_MINUTES
                ),
            ),
            ("[minutes]", READINESS_MINUTES),
        )
    ),
    # env/test.sh's Zip Slip part: an EXECUTION_ENV_PATH archive with a `../` or an absolute
    # entry (made by its zipslip_test.py) must stop the start, write nothing outside, and log
    # the text. (The rest of env/test.sh conda-packs Python and PyTorch environments.)
    *(
        Phase(
            f"env_zipslip_{mode}",
            "env",
            _layout_zipslip(mode),
            [],
            models_dir="zipslip_models",
            server_log=f"zipslip_{mode}_server.log",
            server_args=("--log-verbose=1", "--exit-on-error=true"),  # tritonserver's default
            log_checks={
                f"grep {expected!r}": _log_has(expected),
                "no marker written": _no_marker(mode),
            },
            expect_ready=False,
        )
        for mode, expected in ZIPSLIP_CASES.items()
    ),
    # qa/L0_parameters/test.sh: one server per parameters_test.py case, with its flags...
    *(
        Phase(
            f"L0_parameters_{case}",
            "../L0_parameters",
            _layout_l0_parameters,
            [
                Step(
                    f"L0_parameters[{case}]",
                    "parameters_test.py",
                    select=(f"InferenceParametersTest::{case}",),
                )
            ],
            server_args=("--exit-timeout-secs=120", *flags),
            server_log="inference_server.log",
        )
        for case, flags in (
            ("test_params", ()),
            ("test_params_reserved_rejected", ()),
            (
                "test_headers",
                ("--grpc-header-forward-pattern", "MY_HEADER.*")
                + ("--http-header-forward-pattern", "MY_HEADER.*"),
            ),
            ("test_grpc_header_forward_pattern_case_sensitive", ()),
            (
                "test_headers_reserved_rejected",
                ("--grpc-header-forward-pattern", ".*", "--http-header-forward-pattern", ".*"),
            ),
        )
    ),
    # ...then class_count_test.py over each protocol.
    *(
        Phase(
            f"L0_parameters_class_count_{client_type}",
            "../L0_parameters",
            _layout_class_count,
            [
                Step(
                    f"L0_parameters[class_count,{client_type}]",
                    "class_count_test.py",
                    env={"CLIENT_TYPE": client_type},
                    runner="unittest",  # test.sh: `python3 class_count_test.py -v`
                )
            ],
            server_log=f"class_count_test_{client_type}_server.log",
        )
        for client_type in ("http", "grpc")
    ),
    # qa/L0_simple_ensemble/test.sh: ensemble_test.py's four servers run Triton's ONNX
    # `simple` model (SKIPPED, never started); the backpressure servers are Python models.
    Phase(
        "L0_simple_ensemble",
        "../L0_simple_ensemble",
        lambda layout: None,
        [Step("L0_simple_ensemble", "ensemble_test.py")],
        fresh_models=False,
    ),
    Phase(
        "L0_simple_ensemble_step_max_queue_size",
        "../L0_simple_ensemble",
        _layout_step_max_queue_size,
        [
            Step(
                "L0_simple_ensemble[EnsembleStepMaxQueueSizeTest]",
                "ensemble_backpressure_test.py",
                select=("EnsembleStepMaxQueueSizeTest",),
                runner="unittest",  # test.sh: `python FILE CLASS -v`
            )
        ],
        server_args=(),
        models_dir="max_queue_size_test_models",
        server_log="ensemble_step_max_queue_size_test_server.log",
    ),
    Phase(
        "L0_simple_ensemble_parallel_failed_enqueue",
        "../L0_simple_ensemble",
        _layout_parallel_failed_enqueue,
        [
            Step(
                "L0_simple_ensemble[EnsembleParallelFailedEnqueueTest]",
                "ensemble_backpressure_test.py",
                env={"PARALLEL_FAILED_ENQUEUE_LOOPS": "1"},
                select=("EnsembleParallelFailedEnqueueTest",),
                runner="unittest",  # test.sh: `python FILE CLASS -v`
            )
        ],
        server_args=(),
        models_dir="parallel_failed_enqueue_test_models",
        server_log="ensemble_parallel_failed_enqueue_test_server.log",
        # test.sh's `kill -0 $SERVER_PID` and `wait_for_server_live $SERVER_PID 5`
        after=("curl -s -f --retry 4 --retry-connrefused http://localhost:8000/v2/health/live",),
        log_checks={"server live after the test": lambda run: None},
    ),
    # EnsembleBackpressureTest on one server as test.sh runs it, in two: its two cases of
    # minutes (BACKPRESSURE_MINUTES) are left to the heavy step (DYN_BRIDGE_UPSTREAM_HEAVY=1).
    *(
        Phase(
            f"L0_simple_ensemble_backpressure{suffix}",
            "../L0_simple_ensemble",
            _layout_ensemble_backpressure,
            [
                Step(
                    f"L0_simple_ensemble[EnsembleBackpressureTest{suffix}]",
                    "ensemble_backpressure_test.py",
                    select=tuple(f"EnsembleBackpressureTest::{case}" for case in cases),
                    case_timeout=300,
                    runner="unittest",  # test.sh: `python FILE CLASS -v`
                )
            ],
            server_args=(),
            models_dir="ensemble_backpressure_test_models",
            server_log="ensemble_backpressure_test_server.log",
            log_checks=checks,
        )
        for suffix, cases, checks in (
            (
                "",
                (
                    "test_single_request_with_different_limits",
                    "test_request_cancellation_under_backpressure",
                ),
                {
                    f"grep ensemble_limit_{limit}": _log_has(
                        f"Ensemble model 'ensemble_limit_{limit}' configured with "
                        f"max_inflight_requests: {limit}"
                    )
                    for limit in (1, 4)
                },
            ),
            (",minutes", BACKPRESSURE_MINUTES, {}),
        )
    ),
    Phase(
        "L0_simple_ensemble_invalid_max_inflight_requests",
        "../L0_simple_ensemble",
        _layout_invalid_max_inflight,
        [],
        models_dir="invalid_param_test_models",
        server_log="invalid_max_inflight_requests_server.log",
        server_args=("--exit-on-error=true",),  # tritonserver's default
        log_checks={
            f"grep {text!r}": _log_has(text)
            for text in (
                "Expected integer, got: -",
                'Expected integer, got: "invalid_value"',
                "Integer out of range (12345678901)",
            )
        },
        expect_ready=False,
    ),
]

# `label::case` -> why it cannot run here. Left out of the upstream run.
NEEDS_GPU = "needs a GPU: its model moves tensors to CUDA (torch .to('cuda') / .cuda())"
BLS_SUITE = (
    "needs a GPU and non-Python models: the model's own unittest suite has GPU cases "
    "(test_gpu_bls, test_bls_tensor_lifecycle, CUDA memory pool checks) and calls ONNX and "
    "libtorch models from Triton's qa data (onnx_nobatch_sequence_int32, libtorch_gpu/_cpu); "
    "one upstream case covers the whole suite"
)
# bls_memory(_async) send a 1 GiB tensor and then 4 of 200 MiB through BLS: ~7 GB resident and
# over a minute a case on a 2-core machine, four runs. Run with DYN_BRIDGE_UPSTREAM_HEAVY=1 (a CI
# step of its own); in the main pass they are left out, named here.
HEAVY = os.environ.get("DYN_BRIDGE_UPSTREAM_HEAVY") == "1"
TOO_HEAVY = (
    "1 GiB tensors through BLS (~7 GB resident, minutes): runs only with "
    "DYN_BRIDGE_UPSTREAM_HEAVY=1, outside the main test pass"
)
CUDA_SHM = "needs a GPU: CUDA shared memory"
# Python-model cases that run on a GPU host (tests/harness/gpu.py) and are left out elsewhere.
GPU_CASES_SKIPPED: dict[str, str] = (
    {}
    if gpu_missing() is None
    else {
        # decoupled_bls's response thread runs execute_gpu_bls() before it answers; without
        # CUDA it raises and the request never ends (as in Triton without a GPU).
        "decoupled::DecoupledTest::test_decoupled_bls": NEEDS_GPU,
        **{
            f"io[test_ensemble_io,{trial}]::IOTest::test_ensemble_io": NEEDS_GPU
            + " (every combination of the three models' output devices)"
            for trial in ("default", "decoupled")
        },
        "io[test_empty_gpu_output]::IOTest::test_empty_gpu_output": NEEDS_GPU,
        "python_test::PythonTest::test_gpu_tensor_error": CUDA_SHM,
        "python_test::PythonTest::test_dlpack_tensor_error": CUDA_SHM,
        "io[test_variable_gpu_output]::IOTest::test_variable_gpu_output": NEEDS_GPU,
        # the client picks the output's device at random: .cuda() in the model half the time
        "io[test_requested_output_decoupled]::IOTest::test_requested_output_decoupled": NEEDS_GPU,
        **{
            f"bls[bls_async,{kind}]::TestInferShmLeak::test_shm_leak": NEEDS_GPU
            + " (bls_async's multiple_async_bls_* run with gpu=True)"
            for kind in ("non_decoupled", "decoupled")
        },
    }
)
SKIPPED: dict[str, str] = {
    **{
        f"bls[{model},{kind}]::TestInferShmLeak::test_shm_leak": TOO_HEAVY
        for model in ("bls_memory", "bls_memory_async")
        for kind in ("non_decoupled", "decoupled")
        if not HEAVY
    },
    **{
        f"L0_simple_ensemble[EnsembleBackpressureTest,minutes]::EnsembleBackpressureTest::{case}": (
            "minutes of sleeps in its models (~190 s and ~65 s, in Triton too): runs only with "
            "DYN_BRIDGE_UPSTREAM_HEAVY=1, a step of its own beside the main pass"
        )
        for case in BACKPRESSURE_MINUTES
        if not HEAVY
    },
    **{
        f"model_readiness[minutes]::{case}": (
            "over a minute of its model's sleeps (~80 s, in Triton too): runs only with "
            "DYN_BRIDGE_UPSTREAM_HEAVY=1, a step of its own beside the main pass"
        )
        for case in READINESS_MINUTES
        if not HEAVY
    },
    **GPU_CASES_SKIPPED,
    "ensemble::EnsembleTest::test_ensemble_gpu": NEEDS_GPU
    + "; its libtorch step comes from Triton's qa data, not a Python model",
    "python_test::PythonTest::test_growth_error": (
        "tests the size limit of Triton's stub-to-server shared memory pool (test.sh's "
        "--backend-config=python,shm-default-byte-size and the container's 1 GiB /dev/shm): a "
        "1 GiB and a 512 MiB request must fail with Triton's 'Failed to increase the shared "
        "memory pool size'; the bridge has no such pool"
    ),
    **{
        f"bls[bls,{kind}]::TestInferShmLeak::test_shm_leak": BLS_SUITE
        for kind in ("non_decoupled", "decoupled")
    },
    "model_readiness[signal]::TestModelReadiness::test_model_not_ready": (
        "test.sh kills the model's instance before this case with `kill -11`/`kill -9` of "
        "`pgrep -f triton_python_backend_stub`: the bridge's instances are threads, or "
        "processes named model_repository_loader.isolation.child, never Triton's stub (and "
        "on a shared machine that pgrep finds other servers' stubs, e.g. the oracle's); the "
        "bridge restarts a dead instance process at once, where python_backend 26.07 leaves it "
        "dead, so 'sleep 1' later it may be READY again. A dead instance process making "
        "the model NOT READY with Triton's log text is tested in tests/e2e/"
        "test_readiness_checks.py (docs/frontend_differences.md)"
    ),
    **{
        f"L0_parameters[{case}]::InferenceParametersTest::{case}": (
            "the last request of its client matrix goes to qa/L0_parameters' `ensemble`, "
            'whose first step is its `identity` model (backend "identity": Triton\'s '
            "identity backend, not a Python model); the other requests reach the Python "
            "`parameter` model, which test_params_reserved_rejected and "
            "test_headers_reserved_rejected run"
        )
        for case in (
            "test_params",
            "test_headers",
            "test_grpc_header_forward_pattern_case_sensitive",
        )
    },
    **{
        f"L0_simple_ensemble::EnsembleTest::{case}": (
            "its ensembles (ensemble_add_sub_int32_int32_int32, ensemble_partial_add_sub) run "
            "qa/L0_simple_ensemble's `simple` model: platform onnxruntime_onnx, from Triton's "
            "qa model data, not a Python model"
        )
        for case in (
            "test_ensemble_add_sub",
            "test_ensemble_add_sub_one_output",
            "test_ensemble_sequence_flags",
            "test_ensemble_partial_add_sub",
        )
    },
}
# `label::case` -> the bridge's known gap that fails it.
KNOWN_GAPS: dict[str, str] = {}


def _params() -> Iterator[object]:
    for phase in PHASES:
        for step in phase.steps:
            step_in_folder = Step(
                step.label, step.test_file, select=step.select, folder=phase.folder
            )
            for case in step_in_folder.cases():
                test_id = f"{step.label}::{case}"
                marks = []
                if test_id in KNOWN_GAPS:
                    marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[test_id]))
                yield pytest.param(phase.name, step.label, case, id=test_id, marks=marks)


def _checks() -> Iterator[object]:
    for phase in PHASES:
        for check in phase.log_checks:
            test_id = f"{phase.name}::test.sh {check}"
            marks = []
            if test_id in KNOWN_GAPS:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[test_id]))
            yield pytest.param(phase.name, check, id=test_id, marks=marks)


@pytest.fixture(scope="module")
def phase_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], PhaseRun]]:
    """Each phase served once, on its first test's demand (the tests are in phase order)."""
    root = unpack(tmp_path_factory.mktemp("upstream-qa"))
    done: dict[str, PhaseRun] = {}

    def run(name: str) -> PhaseRun:
        if name not in done:
            phase = next(phase for phase in PHASES if phase.name == name)
            done[name] = run_phase(root, phase, set(SKIPPED))
        return done[name]

    yield run


@pytest.mark.parametrize(("phase", "label", "case"), list(_params()))
def test_upstream_case(
    phase_runs: Callable[[str], PhaseRun], phase: str, label: str, case: str
) -> None:
    if f"{label}::{case}" in SKIPPED:
        pytest.skip(SKIPPED[f"{label}::{case}"])
    result = phase_runs(phase)
    outcome, text = result.outcome(label, case)
    if outcome == "skipped":
        pytest.skip(f"the upstream test skips itself: {text}")
    assert outcome == "passed", (
        f"{outcome}: {text[-4000:]}\n----- the upstream run's output\n"
        + result.step_output(label)[-3000:]
    )


@pytest.mark.parametrize(("phase", "check"), list(_checks()))
def test_upstream_log_check(phase_runs: Callable[[str], PhaseRun], phase: str, check: str) -> None:
    result = phase_runs(phase)
    spec = next(p for p in PHASES if p.name == phase)
    assert result.run.ready == spec.expect_ready, result.run.output[-6000:]
    for command in (*spec.before, *spec.after):
        assert result.run.clients.get(command) == 0, result.run.client_output(command)
    spec.log_checks[check](result)
