"""Closed-loop load from client threads with tritonclient: each thread sends a request, waits for
its answer, and sends the next, for a fixed time. Used by the scheduling benchmarks, where the
model's own work (not the transport) is what is measured. They take turns round after round
(`pooled` joins one side's turns) and compare per round (benchmarks/spread.py).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tritonclient.grpc as grpcclient


@dataclass
class LoadResult:
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)  # what `keep` returned, per answer
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        if not self.latencies_ms:
            return {"throughput": None, "errors": len(self.failures), "error": self.failures[:1]}
        ordered = sorted(self.latencies_ms)
        return {
            "throughput": len(ordered) / self.seconds,
            "p50_ms": statistics.median(ordered),
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
            "errors": len(self.failures),
        }


def closed_loop(
    url: str,
    model: str,
    inputs: Callable[[], list[grpcclient.InferInput]],
    concurrency: int,
    seconds: float,
    keep: Callable[[grpcclient.InferResult], Any] | None = None,
    warmup: float = 1.0,
    **infer_kwargs: Any,
) -> LoadResult:
    """`concurrency` threads load `model` for `warmup` s (not recorded), then `seconds` s."""
    result = LoadResult(seconds)
    lock = threading.Lock()

    def worker(deadline: float, record: bool) -> None:
        client = grpcclient.InferenceServerClient(url)
        request_inputs = inputs()
        try:
            while time.monotonic() < deadline:
                start = time.perf_counter()
                try:
                    answer = client.infer(model, request_inputs, client_timeout=30, **infer_kwargs)
                except Exception as exc:  # counted; the run goes on
                    with lock:
                        result.failures.append(str(exc)[:160])
                    continue
                elapsed = (time.perf_counter() - start) * 1000
                if record:
                    kept = keep(answer) if keep is not None else None
                    with lock:
                        result.latencies_ms.append(elapsed)
                        result.results.append(kept)
        finally:
            client.close()

    for record, duration in ((False, min(warmup, seconds)), (True, seconds)):
        deadline = time.monotonic() + duration
        threads = [
            threading.Thread(target=worker, args=(deadline, record), daemon=True)
            for _ in range(concurrency)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(duration + 60)
    return result


def pooled(turns: list[LoadResult]) -> LoadResult:
    """One side's turns as one result: every latency, answer and failure, and the total time."""
    total = LoadResult(sum(t.seconds for t in turns))
    for turn in turns:
        total.latencies_ms += turn.latencies_ms
        total.results += turn.results
        total.failures += turn.failures
    return total
