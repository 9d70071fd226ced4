"""Hot reload (poll mode): a changed model is swapped under traffic with no failed request.

Each test copies tests/repositories/reload/models to its tmp folder and edits the copy, writing
each edited file whole (temp file and rename, `write_file`), so a stalled test never shows the
watcher a half-written file. Waits are bounded (WAIT_S); nothing asserts how fast a reload is
(benchmarks/reload_swap.py measures it).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.reload_support import (
    MODELS,
    VARIANTS,
    Traffic,
    ask_marked,
    copy_models,
    set_line,
    write_file,
)
from tests.e2e.support import fp32_input, line_of, wait_until

DEBOUNCE_S = 0.2


@pytest.fixture
def loads(tmp_path: Path) -> Path:
    """The file `marked` appends `init <MARK>` / `finalize <MARK>` to."""
    return tmp_path / "loads.txt"


@pytest.fixture
def start(bridge_server, loads):
    def start(repo: Path, *args: str):
        return bridge_server(
            repo,
            "--reload-debounce-secs",
            str(DEBOUNCE_S),
            *args,
            env={"RELOAD_LOAD_LOG": str(loads)},
        )

    return start


def events(loads: Path) -> list[str]:
    return loads.read_text().splitlines() if loads.exists() else []


def test_three_edits_under_traffic_fail_no_request(start, tmp_path, loads) -> None:
    repo = copy_models(tmp_path, "marked", "plain")
    server = start(repo)
    model_py = repo / "marked" / "1" / "model.py"
    good = model_py.read_text()
    traffic = Traffic(server.grpc_url).start()
    try:
        wait_until(lambda: traffic.last_mark() == 1, "version 1 answering")
        set_line(model_py, "MARK = ", "MARK = 2")
        wait_until(lambda: traffic.last_mark() == 2, "version 2 answering")

        write_file(model_py, (VARIANTS / "syntax_error.py").read_text())
        wait_until(lambda: "SyntaxError" in server.log_text, "the failed reload in the log")
        answered = len(traffic.marks)
        wait_until(lambda: len(traffic.marks) > answered + 20, "answers after the failed edit")
        assert traffic.last_mark() == 2  # the old version kept serving

        write_file(model_py, good.replace("MARK = 1\n", "MARK = 3\n"))  # the next good change
        wait_until(lambda: traffic.last_mark() == 3, "version 3 answering")
        answered = len(traffic.marks)
        wait_until(lambda: len(traffic.marks) > answered + 20, "answers after version 3")
    finally:
        traffic.stop()

    assert traffic.errors == []
    assert traffic.not_ready == 0  # ModelReady never false during the swaps
    assert set(traffic.marks) == {1, 2, 3}
    assert traffic.marks[-20:] == [3] * 20
    # The failure names the file and the line (the variant's line 6), as Triton words it.
    assert "failed to load 'marked' version 1" in server.log_text
    assert "SyntaxError: invalid syntax (model.py, line 6)" in server.log_text
    # Old versions were finalized after draining; the broken one never initialized.
    wait_until(lambda: {"finalize 1", "finalize 2"} <= set(events(loads)), "old finalized")
    assert [e for e in events(loads) if e.startswith("init")] == ["init 1", "init 2", "init 3"]


def test_bls_callers_reach_the_reloaded_model(start, tmp_path) -> None:
    repo = copy_models(tmp_path, "marked", "via_bls")
    server = start(repo)
    model_py = repo / "marked" / "1" / "model.py"
    traffic = Traffic(server.grpc_url, model="via_bls").start()
    try:
        wait_until(lambda: traffic.last_mark() == 1, "version 1 answering through BLS")
        set_line(model_py, "MARK = ", "MARK = 2")
        wait_until(lambda: traffic.last_mark() == 2, "version 2 answering through BLS")
        answered = len(traffic.marks)
        wait_until(lambda: len(traffic.marks) > answered + 20, "answers after the swap")
    finally:
        traffic.stop()
    assert traffic.errors == []
    assert set(traffic.marks) == {1, 2}
    assert traffic.marks == sorted(traffic.marks)  # never back to the old version


def test_helper_config_and_new_version_folder(start, tmp_path) -> None:
    repo = copy_models(tmp_path, "marked")
    server = start(repo)
    client = server.client()
    assert ask_marked(client) == (1, 1)

    # A helper module beside model.py, imported at module level.
    set_line(repo / "marked" / "1" / "helper.py", "HELPER_MARK = ", "HELPER_MARK = 4")
    wait_until(lambda: ask_marked(client) == (1, 4), "the helper change answering")

    # config.pbtxt: ModelConfig shows the new config.
    config = repo / "marked" / "config.pbtxt"
    write_file(
        config,
        config.read_text() + 'parameters { key: "flavour" value: { string_value: "two" } }\n',
    )

    def flavour() -> object:
        parameters = client.get_model_config("marked", as_json=True)["config"].get("parameters")
        return (parameters or {}).get("flavour")

    wait_until(lambda: flavour() == {"string_value": "two"}, "the new config served")
    assert client.is_model_ready("marked")

    # A new version folder: the default policy (latest 1) serves version 2 only.
    shutil.copytree(repo / "marked" / "1", repo / "marked" / "2")
    set_line(repo / "marked" / "2" / "model.py", "MARK = ", "MARK = 7")
    wait_until(lambda: ask_marked(client) == (7, 4), "version 2 answering")
    # (ModelMetadata `versions` stays ["1"]: fixed by Dynamo's frontend, see
    # docs/frontend_differences.md.)
    assert client.is_model_ready("marked")


def test_cache_and_editor_files_reload_nothing(start, tmp_path, loads) -> None:
    repo = copy_models(tmp_path, "marked")
    server = start(repo)
    client = server.client()
    assert ask_marked(client) == (1, 1)
    version_dir = repo / "marked" / "1"
    model_py = version_dir / "model.py"

    cache = version_dir / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "model.cpython-311.pyc").write_bytes(b"not bytecode")
    (version_dir / ".model.py.swp").write_bytes(b"vim swap")
    (version_dir / "model.py~").write_text("backup")
    (version_dir / "4913").write_text("")
    (version_dir / ".#model.py").write_text("emacs lock")
    os.utime(model_py)  # a touch: new mtime, same bytes
    write_file(model_py, model_py.read_text())  # a save that writes the same bytes
    time.sleep(5 * DEBOUNCE_S)  # let a (wrong) reload of those events start

    # A real change as the control: exactly one reload must follow, for it alone.
    set_line(version_dir / "helper.py", "HELPER_MARK = ", "HELPER_MARK = 2")
    wait_until(lambda: ask_marked(client) == (1, 2), "the real change answering")
    assert [e for e in events(loads) if e.startswith("init")] == ["init 1", "init 1"]
    assert server.log_text.count("reloading 'marked'") == 1


def test_added_model_appears_and_removed_one_is_unloaded(start, tmp_path, loads) -> None:
    repo = copy_models(tmp_path, "marked")
    server = start(repo)
    client = server.client()
    assert not client.is_model_ready("plain")

    shutil.copytree(MODELS / "plain", repo / "plain")
    wait_until(lambda: client.is_model_ready("plain"), "the new model ready")
    result = client.infer("plain", [fp32_input([2.5])])
    assert result.as_numpy("OUTPUT0").tolist() == [2.5]

    shutil.rmtree(repo / "marked")
    wait_until(lambda: not client.is_model_ready("marked"), "the removed model gone")
    with pytest.raises(InferenceServerException):
        ask_marked(client)
    wait_until(lambda: "finalize 1" in events(loads), "the removed model finalized")
    assert client.is_model_ready("plain")


def test_failing_initialize_and_bad_config_keep_the_old_version(start, tmp_path) -> None:
    repo = copy_models(tmp_path, "marked")
    server = start(repo)
    client = server.client()
    model_py = repo / "marked" / "1" / "model.py"
    good = model_py.read_text()

    write_file(model_py, (VARIANTS / "init_raises.py").read_text())
    wait_until(lambda: "initialize refuses" in server.log_text, "the failed reload logged")
    # Triton's reason text, with the file and line of the raise.
    line = line_of(VARIANTS / "init_raises.py", "raise RuntimeError")
    assert "RuntimeError: reload test: initialize refuses" in server.log_text
    assert f"{model_py.resolve()}({line}): initialize" in server.log_text
    assert ask_marked(client) == (1, 1)
    assert client.is_model_ready("marked")

    write_file(model_py, good)  # back to a loadable model.py, then break the config
    config = repo / "marked" / "config.pbtxt"
    good_config = config.read_text()
    write_file(config, "this is not a config {")
    wait_until(lambda: "failed to read text proto" in server.log_text, "the bad config logged")
    assert ask_marked(client) == (1, 1)

    write_file(config, good_config)
    set_line(model_py, "MARK = ", "MARK = 5")
    wait_until(lambda: ask_marked(client) == (5, 1), "the next good change answering")


def test_reload_beside_the_triton_door_in_process_waits_no_grace(
    bridge_server, tmp_path, loads
) -> None:
    # `--role all` with the triton door (`mem` discovery): the door's directory is told of the
    # new generation in-process, and no door elsewhere can route here, so the replaced one is
    # retired without DYN_BRIDGE_REMOTE_FRONTEND_GRACE_SECS (set far past every wait here: the
    # old generation's finalize would not come in time if the reload slept it).
    repo = copy_models(tmp_path, "marked")
    server = bridge_server(
        repo,
        "--reload-debounce-secs",
        str(DEBOUNCE_S),
        env={"RELOAD_LOAD_LOG": str(loads), "DYN_BRIDGE_REMOTE_FRONTEND_GRACE_SECS": "600"},
    )
    model_py = repo / "marked" / "1" / "model.py"
    client = server.client()
    assert ask_marked(client)[0] == 1
    set_line(model_py, "MARK = ", "MARK = 2")
    wait_until(lambda: "finalize 1" in events(loads), "the replaced generation finalized")
    assert ask_marked(client)[0] == 2
