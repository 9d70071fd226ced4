"""Helpers for the hot-reload and model-control tests: a repository copy, edits, traffic."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from tests.e2e.support import REPOSITORIES, fp32_input

RELOAD = REPOSITORIES / "reload"
MODELS = RELOAD / "models"
VARIANTS = RELOAD / "variants"


def copy_models(tmp_path: Path, *names: str) -> Path:
    """A fresh repository in tmp_path with the given models of reload/models (default: all)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in names or [p.name for p in MODELS.iterdir() if p.is_dir()]:
        shutil.copytree(MODELS / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def write_file(path: Path, text: str) -> None:
    """Write `path` whole, as editors that save by renaming do.

    `write_text` empties the file before writing it: a stall in between longer than the debounce
    would reload an empty file. The temp name ends in `.tmp`, which the watcher ignores; the
    rename is the one event that counts.
    """
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text)
    os.replace(temp, path)


def set_line(path: Path, prefix: str, new_line: str) -> None:
    """Replace the one line starting with `prefix`, writing the file in one go."""
    lines = path.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.startswith(prefix)]
    assert len(hits) == 1, f"{prefix!r} on lines {hits} of {path}"
    lines[hits[0]] = new_line + "\n"
    write_file(path, "".join(lines))


def ask_marked(
    client: grpcclient.InferenceServerClient, model: str = "marked", **kwargs: Any
) -> tuple[int, int]:
    """(MARK, HELPER) answered by `marked` (or by `via_bls`, which asks `marked` through BLS)."""
    result = client.infer(model, [fp32_input([1.0])], **kwargs)
    return int(result.as_numpy("MARK")[0]), int(result.as_numpy("HELPER")[0])


@dataclass
class Traffic:
    """A thread sending `marked` requests back to back; bounded in count and time.

    Records every answer's MARK in order, every failure, and every ModelReady that was false.
    """

    url: str
    model: str = "marked"
    max_requests: int = 5000
    max_seconds: float = 90.0
    marks: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    not_ready: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.max_seconds + 10)

    def last_mark(self) -> int | None:
        return self.marks[-1] if self.marks else None

    def _run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        deadline = time.monotonic() + self.max_seconds
        try:
            for n in range(self.max_requests):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                try:
                    self.marks.append(ask_marked(client, self.model)[0])
                    if n % 10 == 0 and not client.is_model_ready(self.model):
                        self.not_ready += 1
                except Exception as exc:  # every failure is a test failure; keep counting
                    self.errors.append(str(exc))
        finally:
            client.close()


def control(port: int, path: str, body: Any = None) -> tuple[int, Any]:
    """POST to the bridge's (or Triton's HTTP) repository API: (status, parsed JSON or None)."""
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method="POST",
        # urllib would label the body a form (application/x-www-form-urlencoded).
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    return status, (json.loads(raw) if raw else None)


def loader_call(client: grpcclient.InferenceServerClient, **params: str) -> str:
    """Run one model-loading-API call through the `loader` model; its RESULT text."""
    result = client.infer("loader", [fp32_input([0.0])], parameters=params)
    return np.asarray(result.as_numpy("RESULT")).reshape(-1)[0].decode()
