"""Drive the scheduling test models (tests/repositories/batching, sequence) with requests.

Two ways to send a scenario:
* `run_scenario`: a list of `Send`s, each fired at its own offset from the start on its own
  client (so requests really overlap). For what is about time itself: queue delays, timeouts.
* `run_held`: one request holds the model's instance at a gate (a file the test creates), the
  others go one by one, each once the one before is in the model's queue (the server's
  `nv_inference_pending_request_count`) or answered, then the gate opens. For what is about
  order (priorities, queue limits, the default scheduler): no clock involved.

The models answer with a JSON report of the execute call that served them (request ids batched
together, instance, control inputs ...), which is what the tests compare.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

JOIN_S = 30.0


@dataclass(frozen=True)
class Send:
    at: float  # seconds after the scenario starts
    request_id: str
    rows: int = 1  # batch size (batching models)
    sleep_ms: int = 0  # how long the model's execute sleeps
    value: int = 1  # every element of IN
    options: dict[str, Any] = field(
        default_factory=dict
    )  # infer kwargs (priority, sequence_id ...)


@dataclass(frozen=True)
class Outcome:
    out: list[int] | None = None
    report: dict[str, Any] | None = None
    status: str = ""
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.report is not None


def infer(
    client: grpcclient.InferenceServerClient,
    model: str,
    send: Send,
    batching: bool = True,
    extra: dict[str, Any] | None = None,
) -> Outcome:
    shape = [send.rows, 1] if batching else [1]
    tensor = grpcclient.InferInput("IN", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, send.value, np.int32))
    params = {**({"sleep_ms": send.sleep_ms} if send.sleep_ms else {}), **(extra or {})} or None
    try:
        result = client.infer(
            model, [tensor], request_id=send.request_id, parameters=params, **send.options
        )
    except InferenceServerException as exc:
        return Outcome(status=str(exc.status()), message=exc.message() or "")
    report = json.loads(result.as_numpy("REPORT").ravel()[0])
    return Outcome(result.as_numpy("OUT").ravel().tolist(), report)


def run_scenario(url: str, model: str, sends: list[Send], batching: bool = True) -> dict:
    """Fire every send at its time; request id -> Outcome."""
    outcomes: dict[str, Outcome] = {}
    clients = [grpcclient.InferenceServerClient(url) for _ in sends]
    for client in clients:
        # Each connection made before the clock starts: the scenario times the server, not a
        # new channel's first connect (which gRPC retries after a backoff of about 1 s).
        client.is_server_live()
    start = time.monotonic() + 0.05

    def fire(send: Send, client: grpcclient.InferenceServerClient) -> None:
        time.sleep(max(0.0, start + send.at - time.monotonic()))
        outcomes[send.request_id] = infer(client, model, send, batching)

    threads = [
        threading.Thread(target=fire, args=(s, c), daemon=True)
        for s, c in zip(sends, clients, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    for client in clients:
        client.close()
    missing = [s.request_id for s in sends if s.request_id not in outcomes]
    assert not missing, f"no answer within {JOIN_S}s for {missing}"
    return outcomes


def run_held(
    server: Any, model: str, hold: str, sends: list[Send], folder: Path, batching: bool = True
) -> dict:
    """Request `hold` takes the model's one instance and waits at a gate; then each of `sends`
    goes, in order, once the one before is queued or answered; then the gate opens. `server` is
    a running oracle or bridge (grpc_url, metrics_port). Request id -> Outcome."""
    from tests.e2e.metrics_support import scrape, value

    folder.mkdir(parents=True, exist_ok=True)
    started, gate = folder / f"started-{hold}", folder / "gate"
    outcomes: dict[str, Outcome] = {}
    threads: list[threading.Thread] = []
    clients: list[grpcclient.InferenceServerClient] = []

    def fire(send: Send, extra: dict[str, Any] | None = None) -> threading.Thread:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        clients.append(client)

        def run() -> None:
            outcomes[send.request_id] = infer(client, model, send, batching, extra)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        return thread

    def queued() -> float:
        samples = scrape(server.metrics_port)
        pending = value(samples, "nv_inference_pending_request_count", model=model, version="1")
        return pending or 0.0

    def wait_for(predicate: Any, what: str) -> None:
        deadline = time.monotonic() + JOIN_S
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)

    try:
        fire(Send(0, hold), {"started": str(started), "gate": str(gate)})
        wait_for(started.exists, f"{hold} to hold the instance")
        for send in sends:
            before = queued()
            fire(send)
            wait_for(
                lambda send=send, before=before: send.request_id in outcomes or queued() > before,
                f"{send.request_id} queued or answered",
            )
    finally:
        gate.touch()
        for thread in threads:
            thread.join(JOIN_S)
        for client in clients:
            client.close()
    missing = [rid for rid in [hold, *(s.request_id for s in sends)] if rid not in outcomes]
    assert not missing, f"no answer within {JOIN_S}s for {missing}"
    return outcomes


def groups(outcomes: dict[str, Outcome]) -> list[list[str]]:
    """The execute calls as sorted lists of request ids, in the order they ran per instance.

    Ids are sorted inside a call: requests sent at (nearly) the same moment may reach a server
    in either order."""
    calls = {
        (o.report["instance"], o.report["call"]): o.report["ids"] for o in outcomes.values() if o.ok
    }
    return [sorted(ids) for _, ids in sorted(calls.items())]


def errors(outcomes: dict[str, Outcome]) -> dict[str, tuple[str, str]]:
    return {rid: (o.status, o.message) for rid, o in outcomes.items() if not o.ok}
