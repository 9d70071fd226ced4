"""A worker cut off by a partition (issue 39 items 1 and 2), on simulated hosts (network
namespaces, tests/harness/hosts.py; as root, required in CI): etcd and the triton door on host
`a`, workers on `b` (and `c`), the TCP request plane, the layout of benchmarks/partition.py and
of docs/deployment.md "Several hosts".

* With a replica, a cut worker costs the requests it had in flight and nothing else: the door
  sends new requests to the replica at once (fewest in flight), ejects the cut worker at its
  first timeout, and takes it back once it answers its ping again.
* A request the door reported failed (the worker never acknowledged it in time) is not run when
  the link comes back: the worker sees it arrive after its caller gave up.
"""

from __future__ import annotations

import argparse
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from benchmarks import partition
from tests.harness.hosts import Network, require_hosts

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def network(tmp_path: Path):
    require_hosts()
    with Network(["a", "b", "c"], workdir=tmp_path / "hosts") as made:
        yield made


def test_a_cut_worker_costs_only_its_requests_in_flight(network: Network, tmp_path: Path) -> None:
    cluster = partition.start_cluster(network, tmp_path)
    partition.wait_both_serve(network, cluster["url"])
    args = argparse.Namespace(seconds=16, cut_at=4, cut_for=7, concurrency=8, client_timeout=60.0)
    result = partition.load(cluster["url"], args, network)
    summary = partition.summarize(result, args)
    print(partition.format_table(result, summary, args))
    # Without ejection and fewest-in-flight, every client ends up waiting on the cut worker and
    # each of its requests fails: a failure per client per 5 s for the whole cut.
    assert summary["failed"] <= args.concurrency, result["errors"]
    during = result["answered"][args.cut_at + 1 : args.cut_at + args.cut_for]
    assert all(during), f"a second of the cut with no answer: {during}"
    # Back in rotation once it answers its ping: TCP redelivers on the connection it had, with
    # the backoff of its retransmissions (a few seconds after a cut of several).
    b = network["b"].address
    client = grpcclient.InferenceServerClient(cluster["url"])
    before = partition.executions(b)
    deadline = time.monotonic() + 90
    while partition.executions(b) <= before:
        assert time.monotonic() < deadline, "the cut worker never served again"
        for _ in range(8):
            client.infer("add_sub", partition.add_sub_inputs(), client_timeout=30)
        time.sleep(0.2)
    frontend_log = cluster["door"].log_text()
    # let back by its ping (a bridge worker's route), not by the time of a foreign worker's
    assert "does not answer" in frontend_log and "answers its ping" in frontend_log
    assert "is tried again" not in frontend_log


# The door's answer for a model whose only worker the index has left out (Triton's text).
NOT_READY = "is not at ready state"

RECORDER = textwrap.dedent(
    """
    import os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                with open(os.environ["RECORD_FILE"], "a") as record:
                    record.write(f"{int(x[0])}\\n")
                out = pb_utils.Tensor("Y", x.astype(np.int32))
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
    """
)


def _recorder_repository(root: Path) -> Path:
    model = root / "recorder"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "recorder"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
    )
    (model / "1" / "model.py").write_text(RECORDER)
    return root


def _call(client: grpcclient.InferenceServerClient, value: int) -> str:
    tensor = grpcclient.InferInput("X", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    try:
        client.infer("recorder", [tensor], client_timeout=30)
    except Exception as exc:
        return str(exc)
    return "ok"


def test_requests_the_door_gave_up_on_are_not_run_later(
    network: Network, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record.txt"
    record.touch()
    monkeypatch.setenv("RECORD_FILE", str(record))  # the worker inherits it
    repository = _recorder_repository(tmp_path / "models")
    cluster = partition.start_cluster(network, tmp_path, repository, worker_hosts=("b",))
    client = grpcclient.InferenceServerClient(cluster["url"])
    deadline = time.monotonic() + 120
    while _call(client, 1) != "ok":
        assert time.monotonic() < deadline, "the recorder never answered"
        time.sleep(0.5)

    b = network["b"]
    sent: list[str] = []  # the values of requests the door sent to b and gave up on
    for attempt in range(1, 4):
        values = [100 * attempt + i for i in (1, 2, 3)]
        b.cut()
        try:
            # At once, with the index the door has: sent to b before a round of the index can
            # leave b out (it waits that long for b's answer). A round that began just before
            # the cut may leave b out first; such requests are answered "not at ready state"
            # without being sent, and the cut is tried again.
            with ThreadPoolExecutor(3) as pool:
                failures = list(pool.map(lambda value: _call(client, value), values))
        finally:
            b.restore()
        assert all("timed out" in f or NOT_READY in f for f in failures), failures
        sent += [str(v) for v, f in zip(values, failures, strict=True) if "timed out" in f]
        # The requests are delivered when TCP retransmits them (backing off: seconds after the
        # link is back), on the connection the door's ping of the worker then answers on too.
        deadline = time.monotonic() + 120
        while _call(client, 2) != "ok":
            assert time.monotonic() < deadline, "the worker never served again"
            time.sleep(0.5)
        if sent:
            break
    assert sent, "every request was answered before it was sent: nothing to check"
    worker = cluster["workers"]["b"]
    deadline = time.monotonic() + 20
    while worker.log_text().count(": not run") < len(sent) and time.monotonic() < deadline:
        time.sleep(0.5)
    ran = record.read_text().split()
    assert not set(sent) & set(ran), (sent, ran)
    print(worker.log_text().count(": not run"), "requests refused unstarted")
