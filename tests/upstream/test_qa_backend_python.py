"""Triton's own `qa/L0_backend_python` tests, unmodified, against the bridge's triton door.

Each qa folder's models are laid out as its `test.sh` lays them out (`LAYOUTS`), one server
serves the folder (in a network namespace of its own, on Triton's ports), and the folder's test
file runs there with pytest as test.sh runs it (`STEPS`). Every upstream test case is a test of
ours: it passes when the upstream case passed. A case that cannot run here is skipped by name
(`SKIPPED`: left out of the upstream run too); a case that fails for a known gap in the bridge
is `xfail(strict=True)` with the reason (`KNOWN_GAPS`), so it turns red once fixed.
README.md says which folders run and why the others do not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.upstream.qa_support import L0, FolderRun, Layout, Step, run_folder, upstream_cases
from tests.upstream.support import unpack


def _decoupled(layout: Layout) -> None:
    # decoupled/models/ already holds the folder's own models; test.sh adds these to them.
    layout.model("identity_fp32")
    cancel = layout.model("execute_cancel")
    layout.append(cancel, "model_transaction_policy { decoupled: True }")
    layout.model("response_sender_until_cancelled")
    examples = layout.python_models.parents[2] / "python_backend" / "examples" / "decoupled"
    square = layout.models / "square_int32"
    (square / "1").mkdir(parents=True)
    (square / "1" / "model.py").write_bytes((examples / "square_model.py").read_bytes())
    (square / "config.pbtxt").write_bytes((examples / "square_config.pbtxt").read_bytes())
    layout.model("dlpack_add_sub")


def _lifecycle(layout: Layout) -> None:
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
    layout.model("execute_return_error")
    wrong = layout.model("wrong_model")
    layout.set_line(wrong, "name", '"wrong_model"')
    layout.replace_all(wrong, "TYPE_FP32", "TYPE_UINT32")


def _parameters(layout: Layout) -> None:
    for name in ("response_parameters", "response_parameters_decoupled", "response_parameters_bls"):
        layout.model(name)


def _async_execute(layout: Layout) -> None:
    layout.model("async_execute_decouple")
    layout.model("async_execute_decouple_bls")


LAYOUTS: dict[str, Callable[[Layout], None]] = {
    "decoupled": _decoupled,
    "lifecycle": _lifecycle,
    "parameters": _parameters,
    "async_execute": _async_execute,
}
SERVER_ARGS: dict[str, tuple[str, ...]] = {}
# test.sh's SERVER_LOG, where an upstream case reads the server's log by that name.
SERVER_LOGS = {
    "decoupled": "decoupled_server.log",
    "lifecycle": "lifecycle_server.log",
    "async_execute": "concurrency_test.server.log",
}
STEPS: dict[str, list[Step]] = {
    "decoupled": [Step("decoupled", "decoupled_test.py")],
    # test.sh runs lifecycle_test.py five times on one server; once here, to bound the time.
    "lifecycle": [Step("lifecycle", "lifecycle_test.py")],
    "parameters": [Step("parameters", "response_parameters_test.py")],
    "async_execute": [
        Step(
            "async_execute",
            "concurrency_test.py",
            env={"SERVER_LOG": "concurrency_test.server.log"},
        )
    ],
}

# (folder, step label, case) -> why it cannot run here. Deselected in the upstream run.
NEEDS_GPU = "needs a GPU: its model moves tensors to CUDA (torch .to('cuda') / .cuda())"
SKIPPED: dict[tuple[str, str, str], str] = {
    # decoupled_bls's response thread runs execute_gpu_bls() before it answers; without CUDA it
    # raises and the request never ends (as in Triton without a GPU).
    ("decoupled", "decoupled", "DecoupledTest::test_decoupled_bls"): NEEDS_GPU,
}
# (folder, step label, case) -> the bridge's known gap that fails it.
KNOWN_GAPS: dict[tuple[str, str, str], str] = {
    ("lifecycle", "lifecycle", "LifecycleTest::test_triton_grpc_error_error_on"): (
        "the door ignores the `triton_grpc_error: true` stream header (issue 24, item 4): the "
        "model's error comes back in-stream, not as the stream's INTERNAL status"
    ),
}


def _cases() -> Iterator[object]:
    for folder, steps in STEPS.items():
        for step in steps:
            for case in upstream_cases(f"{folder}/{step.test_file}"):
                if step.select and case not in step.select:
                    continue
                key = (folder, step.label, case)
                marks: list[pytest.MarkDecorator] = []
                if key in KNOWN_GAPS:
                    marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[key]))
                yield pytest.param(
                    folder, step.label, case, id=f"{step.label}::{case}", marks=marks
                )


@pytest.fixture(scope="module")
def folder_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], FolderRun]]:
    """Each folder served once, on its first case's demand (the cases are in folder order)."""
    root = unpack(tmp_path_factory.mktemp("upstream-qa"))
    done: dict[str, FolderRun] = {}

    def run(folder: str) -> FolderRun:
        if folder not in done:
            done.clear()  # a folder's output is read by its own cases only
            models = root / L0 / folder / "models"
            layout = Layout(root, models)
            LAYOUTS[folder](layout)
            steps = [
                Step(
                    step.label,
                    step.test_file,
                    env=step.env,
                    select=step.select,
                    skip=tuple(
                        case for (f, label, case) in SKIPPED if f == folder and label == step.label
                    ),
                    folder=folder,
                )
                for step in STEPS[folder]
            ]
            done[folder] = run_folder(
                root,
                folder,
                models,
                steps,
                SERVER_ARGS.get(folder, ()),
                server_log=SERVER_LOGS.get(folder, "server.log"),
            )
        return done[folder]

    yield run


@pytest.mark.parametrize(("folder", "label", "case"), list(_cases()))
def test_upstream_case(
    folder_runs: Callable[[str], FolderRun], folder: str, label: str, case: str
) -> None:
    if (folder, label, case) in SKIPPED:
        pytest.skip(SKIPPED[(folder, label, case)])
    result = folder_runs(folder)
    outcome, text = result.outcome(label, case)
    if outcome == "skipped":
        pytest.fail(f"the upstream case skipped itself: {text}")
    assert outcome == "passed", (
        f"{outcome}: {text[-4000:]}\n----- the upstream run's output\n"
        + result.step_output(label)[-3000:]
    )
