"""Reload lifecycle (poll mode): a hung reload holds up only its own model, a failed reload is
retried on the next event for it, and retired generations are freed.

Like test_reload.py, each test edits a copy of tests/repositories/reload/models (or of
tests/repositories/lifecycle) in its tmp folder, writing every file whole.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from tests.e2e.reload_support import MODELS, ask_marked, copy_models, set_line, write_file
from tests.e2e.support import REPOSITORIES, WAIT_S, fp32_input, wait_until

DEBOUNCE_S = 0.2
LIFECYCLE = REPOSITORIES / "lifecycle"


def start(bridge_server, repo: Path, env: dict[str, str] | None = None):
    return bridge_server(repo, "--reload-debounce-secs", str(DEBOUNCE_S), env=env)


def copy_marked_as(repo: Path, name: str) -> None:
    """A second `marked` model under another name."""
    shutil.copytree(MODELS / "marked", repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    config = repo / name / "config.pbtxt"
    write_file(config, config.read_text().replace('name: "marked"', f'name: "{name}"'))


def with_initialize(model_text: str, mark: int, body: list[str]) -> str:
    """marked's model.py with MARK = `mark` and `body` run first in initialize()."""
    lines = "".join(f"        {line}\n" for line in body)
    text = model_text.replace("MARK = 1\n", f"MARK = {mark}\n")
    text = text.replace("import os\n", "import os\nimport time\n")
    head = "    def initialize(self, args):\n"
    assert head in text
    return text.replace(head, head + lines)


def test_hung_initialize_blocks_only_its_own_model(bridge_server, tmp_path) -> None:
    repo = copy_models(tmp_path, "marked")
    copy_marked_as(repo, "other")
    server = start(bridge_server, repo)
    client = server.client()
    assert ask_marked(client) == (1, 1)
    assert ask_marked(client, "other") == (1, 1)

    started, gate = tmp_path / "init-started", tmp_path / "init-gate"
    model_py = repo / "marked" / "1" / "model.py"
    hanging = with_initialize(
        model_py.read_text(),
        2,
        [
            f"open({str(started)!r}, 'w').close()",
            f"while not os.path.exists({str(gate)!r}):",
            "    time.sleep(0.01)",
        ],
    )
    write_file(model_py, hanging)
    wait_until(started.exists, "marked's new initialize to hang")

    # Another model's change loads while marked's reload hangs; marked keeps serving.
    set_line(repo / "other" / "1" / "model.py", "MARK = ", "MARK = 5")
    wait_until(lambda: ask_marked(client, "other") == (5, 1), "other's change answering")
    assert ask_marked(client) == (1, 1)
    wait_until(lambda: "still loading 'marked' after" in server.log_text, "the slow load logged")

    gate.write_text("open")
    wait_until(lambda: ask_marked(client) == (2, 1), "marked's reload finishing")


def test_shutdown_does_not_wait_for_a_hung_reload(bridge_server, tmp_path) -> None:
    repo = copy_models(tmp_path, "marked")
    server = bridge_server(
        repo, "--reload-debounce-secs", str(DEBOUNCE_S), "--exit-timeout-secs", "2"
    )
    assert ask_marked(server.client()) == (1, 1)
    started = tmp_path / "init-started"
    model_py = repo / "marked" / "1" / "model.py"
    body = [f"open({str(started)!r}, 'w').close()", "while True:", "    time.sleep(0.01)"]
    write_file(model_py, with_initialize(model_py.read_text(), 2, body))
    wait_until(started.exists, "the reload's initialize to hang")

    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(2 + WAIT_S)  # the bound only catches "never"
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running:\n{server.log_tail()}") from None


def test_failed_reload_is_retried_on_the_next_event(bridge_server, tmp_path) -> None:
    repo = copy_models(tmp_path, "marked")
    server = start(bridge_server, repo)
    client = server.client()
    assert ask_marked(client) == (1, 1)

    refuse = tmp_path / "refuse"
    refuse.write_text("the next initialize fails")
    model_py = repo / "marked" / "1" / "model.py"
    write_file(
        model_py,
        with_initialize(
            model_py.read_text(),
            2,
            [
                f"if os.path.exists({str(refuse)!r}):",
                "    raise RuntimeError('transient refusal')",
            ],
        ),
    )
    wait_until(lambda: "transient refusal" in server.log_text, "the failed reload logged")
    assert ask_marked(client) == (1, 1)

    # The cause goes away; the files do not change. A touch is enough to try again.
    refuse.unlink()
    os.utime(model_py)
    wait_until(lambda: ask_marked(client) == (2, 1), "the retried reload answering")


def vm_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_reloads_free_retired_generations(bridge_server, tmp_path) -> None:
    generation_mb, reloads = 200, 5
    repo = tmp_path / "repo"
    shutil.copytree(LIFECYCLE / "weighty", repo / "weighty")
    server = start(bridge_server, repo, env={"WEIGHTY_MB": str(generation_mb)})
    client = server.client()

    def mark() -> int:
        return int(client.infer("weighty", [fp32_input([0.0])]).as_numpy("MARK")[0])

    assert mark() == 1
    pid = server.process.pid
    first = vm_rss_mb(pid)
    seen = [first]
    model_py = repo / "weighty" / "1" / "model.py"
    for n in range(2, reloads + 2):
        set_line(model_py, "MARK = ", f"MARK = {n}")
        wait_until(lambda n=n: mark() == n, f"generation {n} answering")
        unloaded = f"successfully unloaded 'weighty' (generation {n - 1})"
        wait_until(lambda text=unloaded: text in server.log_text, f"generation {n - 1} unloaded")
        seen.append(vm_rss_mb(pid))

    # Every retired generation's weights are freed: within a small margin of one generation.
    margin = generation_mb / 4
    try:
        wait_until(lambda: vm_rss_mb(pid) < first + margin, "memory back to one generation")
    except AssertionError:
        raise AssertionError(
            f"RSS after each reload (MB): {[round(r) for r in seen]}, now {vm_rss_mb(pid):.0f}; "
            f"one generation is {generation_mb} MB"
        ) from None
