"""Hot reload under load: time from saving model.py to the new version answering, and failures.

    python -m benchmarks.reload_swap [--swaps 5] [--clients 4] [--debounce 0.2] [--max-seconds 120]

Starts the bridge (poll mode) on a copy of tests/repositories/reload/models/marked, keeps
`--clients` threads sending requests back to back, and rewrites the `MARK = <n>` line of
model.py `--swaps` times. For each save it reports the time until the first answer carrying the
new mark (the debounce included: that is what a user waits), and it counts every failed request
over the whole run. Runtime is bounded by `--max-seconds`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.harness.bridge_server import BridgeServer  # noqa: E402

MODEL = ROOT / "tests" / "repositories" / "reload" / "models" / "marked"


class Load:
    """Client threads sending `marked` requests; the first time each MARK was seen; failures."""

    def __init__(self, url: str, clients: int) -> None:
        self.url = url
        self.first_seen: dict[int, float] = {}
        self.ok = 0
        self.failed: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        data = grpcclient.InferInput("INPUT0", [1], "FP32")
        data.set_data_from_numpy(np.array([1.0], np.float32))
        try:
            while not self._stop.is_set():
                try:
                    mark = int(client.infer("marked", [data]).as_numpy("MARK")[0])
                except Exception as exc:
                    with self._lock:
                        self.failed.append(str(exc))
                    continue
                now = time.perf_counter()
                with self._lock:
                    self.ok += 1
                    self.first_seen.setdefault(mark, now)
        finally:
            client.close()


def set_mark(model_py: Path, mark: int) -> None:
    lines = model_py.read_text().splitlines(keepends=True)
    lines = [f"MARK = {mark}\n" if line.startswith("MARK = ") else line for line in lines]
    model_py.write_text("".join(lines))


def run(swaps: int, clients: int, debounce: float, max_seconds: float) -> dict:
    deadline = time.monotonic() + max_seconds
    work = Path(tempfile.mkdtemp(prefix="reload-swap-"))
    repo = work / "repo"
    shutil.copytree(MODEL, repo / "marked", ignore=shutil.ignore_patterns("__pycache__"))
    model_py = repo / "marked" / "1" / "model.py"
    server = BridgeServer(
        repo, "--reload-debounce-secs", str(debounce), log_path=work / "bridge.log"
    )
    server.start()
    load = Load(server.grpc_url, clients)
    times: list[float] = []
    try:
        server.wait_model_ready("marked", timeout=60)
        load.start()
        while 1 not in load.first_seen and time.monotonic() < deadline:
            time.sleep(0.01)
        for mark in range(2, swaps + 2):
            if time.monotonic() >= deadline:
                break
            saved = time.perf_counter()
            set_mark(model_py, mark)
            while mark not in load.first_seen and time.monotonic() < deadline:
                time.sleep(0.002)
            if mark in load.first_seen:
                times.append(load.first_seen[mark] - saved)
            time.sleep(max(0.3, debounce))  # a quiet spell between saves
    finally:
        load.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "swaps_requested": swaps,
        "swaps_seen": len(times),
        "clients": clients,
        "debounce_s": debounce,
        "save_to_new_version_ms": [round(t * 1000, 1) for t in times],
        "requests_ok": load.ok,
        "requests_failed": len(load.failed),
        "failures": sorted(set(load.failed))[:5],
    }


def report(result: dict) -> str:
    ms = result["save_to_new_version_ms"]
    lines = [
        f"reload swap: {result['swaps_seen']}/{result['swaps_requested']} swaps, "
        f"{result['clients']} client threads, debounce {result['debounce_s']:.2f} s",
    ]
    if ms:
        lines.append(
            f"save -> new version answering: median {statistics.median(ms):.0f} ms, "
            f"min {min(ms):.0f} ms, max {max(ms):.0f} ms (each: {', '.join(map(str, ms))})"
        )
    lines.append(
        f"requests under load: {result['requests_ok']} ok, {result['requests_failed']} failed"
    )
    lines += [f"  failure: {text}" for text in result["failures"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--swaps", type=int, default=5)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--debounce", type=float, default=0.2, help="--reload-debounce-secs")
    p.add_argument("--max-seconds", type=float, default=120.0, help="bound on the whole run")
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    result = run(args.swaps, args.clients, args.debounce, args.max_seconds)
    print(report(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
