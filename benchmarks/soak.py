"""Soak: many mixed requests while models hot-reload; what the server holds before and after.

    python -m benchmarks.soak [--requests 20000] [--clients 6] [--reload-every 3]
                              [--max-seconds 600]

Starts the bridge (poll mode) on a copy of examples/model_repository plus the `marked` reload test
model, and keeps `--clients` threads sending a mix of requests until `--requests` have been sent
(or `--max-seconds` passed):

    add_sub        FP32 [1, 4] unary, dynamic batching, thread instance
    text_case      BYTES unary
    strict_divide  every fifth call divides by zero: an expected error response
    marked         unary, reloaded every `--reload-every` seconds (thread instance); its copy
                   holds `--ballast-mib` of numpy at module level, so a retired generation that
                   is never freed shows in the RSS
    token_streamer a 4-token stream; reloaded too, in turn with `marked` (process instances)

Every `--reload-every` seconds one of the two reloaded models gets a new `MARK`/docstring line in
its model.py, so the generations come and go under load. The server's resident memory (its
process and its instance processes), thread count and open file descriptors are read from /proc
after a warm-up and again after the load stopped and the last retired generation was finalized.
A leak shows as growth that scales with the number of reloads and requests. Requests that failed
for any reason other than the expected division error are counted and shown.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.harness.bridge_server import BridgeServer  # noqa: E402

EXAMPLES = ROOT / "examples" / "model_repository"
MARKED = ROOT / "tests" / "repositories" / "reload" / "models" / "marked"
SOAK_MODELS = ("add_sub", "text_case", "strict_divide", "token_streamer")
DIVIDE_BY_ZERO = "division by zero"  # strict_divide's own error text


@dataclass
class Snapshot:
    rss_mib: float
    processes: int
    threads: int
    fds: int


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    expected_errors: int = 0
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, limit: int) -> bool:
        with self.lock:
            if self.sent >= limit:
                return False
            self.sent += 1
            return True

    def count(self, error: str | None) -> None:
        with self.lock:
            if error is None:
                self.ok += 1
            elif DIVIDE_BY_ZERO in error:
                self.expected_errors += 1
            else:
                self.failures.append(error[:300])


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def _status(pid: int, key: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+)", text, re.M).group(1))  # type: ignore[union-attr]


def snapshot(pid: int) -> Snapshot:
    """RSS of the server and every process below it; threads and fds of the server itself."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += _children(current)
    rss_kib = 0
    for member in tree:
        try:
            rss_kib += _status(member, "VmRSS")
        except (OSError, AttributeError):
            pass  # it just exited
    return Snapshot(
        rss_mib=rss_kib / 1024,
        processes=len(tree),
        threads=_status(pid, "Threads"),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
    )


def _input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


class Client:
    """One client thread's connection and its turn through the request mix."""

    def __init__(self, url: str, seed: int) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.turn = seed
        self.stream_answers: queue.SimpleQueue = queue.SimpleQueue()
        self.client.start_stream(lambda result, error: self.stream_answers.put((result, error)))

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()

    def one(self) -> str | None:
        """Send the next request of the mix; the error text, or None."""
        self.turn += 1
        kind = self.turn % 5
        try:
            if kind == 0:
                x = np.arange(4, dtype=np.float32).reshape(1, 4)
                self.client.infer(
                    "add_sub", [_input("INPUT0", x, "FP32"), _input("INPUT1", x, "FP32")]
                )
            elif kind == 1:
                text = np.array([["soak", "wörld"]], dtype=np.object_)
                self.client.infer("text_case", [_input("TEXT", text, "BYTES")])
            elif kind == 2:
                num = np.ones((1, 3), np.float32)
                den = np.zeros((1, 3), np.float32) if self.turn % 25 == 2 else num
                self.client.infer(
                    "strict_divide",
                    [_input("NUMERATOR", num, "FP32"), _input("DENOMINATOR", den, "FP32")],
                )
            elif kind == 3:
                self.client.infer("marked", [_input("INPUT0", np.ones(2, np.float32), "FP32")])
            else:
                return self._stream()
        except Exception as exc:
            return str(exc)
        return None

    def _stream(self) -> str | None:
        prompt = np.array(["one two three four"], dtype=np.object_)
        self.client.async_stream_infer("token_streamer", [_input("PROMPT", prompt, "BYTES")])
        for _ in range(4):
            try:
                result, error = self.stream_answers.get(timeout=30)
            except queue.Empty:
                return "stream: no answer within 30 s"
            if error is not None:
                return f"stream: {error}"
        return None


def _touch_model(repo: Path, name: str, generation: int) -> None:
    """A new version of the model's code: rewrite MARK (marked) or a trailing comment."""
    model_py = repo / name / "1" / "model.py"
    text = model_py.read_text()
    if name == "marked":
        text = re.sub(r"^MARK = \d+$", f"MARK = {generation}", text, flags=re.M)
    else:
        text = re.sub(r"\n# soak generation \d+\n$", "\n", text)
        text += f"\n# soak generation {generation}\n"
    tmp = model_py.with_name("model.py.tmp")  # *.tmp: ignored by the watcher
    tmp.write_text(text)
    os.replace(tmp, model_py)


def run(
    requests: int, clients: int, reload_every: float, max_seconds: float, ballast_mib: int
) -> dict:
    deadline = time.monotonic() + max_seconds
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    repo = work / "repo"
    for name in SOAK_MODELS:
        shutil.copytree(EXAMPLES / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(MARKED, repo / "marked", ignore=shutil.ignore_patterns("__pycache__"))
    marked_py = repo / "marked" / "1" / "model.py"
    ballast = f"\nBALLAST = np.ones({ballast_mib} * 2**20, np.uint8)  # soak: held per generation\n"
    marked_py.write_text(marked_py.read_text() + ballast)
    log_path = work / "bridge.log"
    server = BridgeServer(repo, "--reload-debounce-secs", "0.2", log_path=log_path)
    server.start()
    tally = Tally()
    reloads = 0
    try:
        for name in (*SOAK_MODELS, "marked"):
            server.wait_model_ready(name, timeout=60)
        warm = Client(server.grpc_url, 0)
        for _ in range(50):
            warm.one()
        warm.close()
        before = snapshot(server.process.pid)
        started = time.monotonic()

        def drive(seed: int) -> None:
            client = Client(server.grpc_url, seed)
            try:
                while time.monotonic() < deadline and tally.take(requests):
                    tally.count(client.one())
            finally:
                client.close()

        threads = [threading.Thread(target=drive, args=(k,), daemon=True) for k in range(clients)]
        for thread in threads:
            thread.start()
        next_reload = time.monotonic() + reload_every
        while any(t.is_alive() for t in threads):
            if time.monotonic() >= next_reload:
                reloads += 1
                _touch_model(repo, ("marked", "token_streamer")[reloads % 2], reloads + 1)
                next_reload += reload_every
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        # Let the last reload finish and its retired generation drain and finalize.
        unloaded = re.compile(r"successfully unloaded")
        settle_until = time.monotonic() + 30
        while time.monotonic() < settle_until:
            if len(unloaded.findall(log_path.read_text(errors="replace"))) >= reloads:
                break
            time.sleep(0.2)
        time.sleep(1.0)
        after = snapshot(server.process.pid)
    finally:
        server.stop()
        finished_log = log_path.read_text(errors="replace") if log_path.exists() else ""
        shutil.rmtree(work, ignore_errors=True)
    return {
        "requests": tally.sent,
        "ok": tally.ok,
        "expected_errors": tally.expected_errors,
        "failed": len(tally.failures),
        "failures": sorted(set(tally.failures))[:5],
        "reloads": reloads,
        "seconds": round(elapsed, 1),
        "before": before.__dict__,
        "after": after.__dict__,
        "log_bytes": len(finished_log.encode()),
        "ballast_mib": ballast_mib,
    }


def report(result: dict) -> str:
    before, after = result["before"], result["after"]
    rows = [("RSS (MiB, server + instance processes)", "rss_mib", "{:.0f}")]
    rows += [("processes", "processes", "{}"), ("threads", "threads", "{}"), ("fds", "fds", "{}")]
    lines = [
        f"soak: {result['requests']} requests in {result['seconds']} s, "
        f"{result['reloads']} reloads (`marked` holds {result['ballast_mib']} MiB a generation)",
        f"  ok {result['ok']}, expected errors {result['expected_errors']}, "
        f"unexpected failures {result['failed']}; server log {result['log_bytes']} bytes",
        "",
        f"| {'':40} | {'before':>8} | {'after':>8} | {'change':>8} |",
        f"|{'-' * 42}|{'-' * 10}|{'-' * 10}|{'-' * 10}|",
    ]
    for label, key, fmt in rows:
        change = after[key] - before[key]
        lines.append(
            f"| {label:40} | {fmt.format(before[key]):>8} | {fmt.format(after[key]):>8} | "
            f"{fmt.format(change):>8} |"
        )
    lines += [f"  failure: {text}" for text in result["failures"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--reload-every", type=float, default=3.0, metavar="SECONDS")
    p.add_argument("--max-seconds", type=float, default=600.0, help="bound on the load phase")
    p.add_argument("--ballast-mib", type=int, default=32, help="memory each `marked` holds")
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    result = run(
        args.requests, args.clients, args.reload_every, args.max_seconds, args.ballast_mib
    )
    print(report(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
