"""Several hosts, as docs/deployment.md "Several hosts" says to run them (issue 39).

The guide is the script: `guide()` reads that section's `bash` blocks that start with
`# host A`, `# host B`, `# host C` (and the nats and client blocks), puts this test's addresses
for the guide's 10.0.0.1, 10.0.0.21 and 10.0.0.22, and each host runs its block's lines as
they are, in a network namespace of its own on a private bridge (tests/harness/hosts.py, as
root): host A etcd, NATS and the frontend, B a worker, C its replica, and the client on a fourth.
Real etcd, nats-server, Dynamo runtime and tritonclient; examples/model_repository.

What the simulation adds to the guide's environment, because the hosts share one kernel: each
process's DYN_BRIDGE_SHM_HOST_ID names its host (a real host has its own boot id and /dev/shm,
so the door and a worker on other hosts never use shared memory), DYN_LOG=warn, and PYTHONPATH
to this checkout.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.bridge_server import PROJECT_ROOT
from tests.harness.cluster import LoadGenerator, describe
from tests.harness.hosts import Host, HostProcess, Network, accepts, require_hosts
from tests.harness.roles import CLUSTER_VARIABLES
from tests.harness.services import require_service

GUIDE = PROJECT_ROOT / "docs" / "deployment.md"
SECTION = "## Several hosts"
EXAMPLES = PROJECT_ROOT / "examples"
# The guide's addresses, by host.
GUIDE_ADDRESSES = {"a": "10.0.0.1", "b": "10.0.0.21", "c": "10.0.0.22"}
EXAMPLE_MODELS = ("add_sub", "text_case", "greeter", "token_streamer", "slow_cancellable")
START_S = 120.0  # a process's start on a loaded 2-core machine, models included
# Variables of the test's own environment that would change what the guide's lines do.
DROPPED = (*CLUSTER_VARIABLES, "DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST",
           "DYN_TCP_RPC_PORT", "DYN_TCP_RESPONSE_STREAM_PORT")  # fmt: skip


@dataclass
class Block:
    """One `bash` block of the guide: what it exports, then the commands it runs."""

    environ: dict[str, str] = field(default_factory=dict)
    commands: list[list[str]] = field(default_factory=list)


def guide() -> dict[str, Block]:
    """The "Several hosts" section's blocks, by the host their first line names ("a", "b",
    "c"), "nats" (every host, for the nats request plane) and "client"."""
    text = GUIDE.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    blocks: dict[str, Block] = {}
    for body in re.findall(r"```bash\n(.*?)```", section, re.S):
        first = body.splitlines()[0]
        named = re.match(r"# host (\w)\b", first)
        if named:
            key = named.group(1).lower()
        elif first.startswith("# every host, for the nats request plane"):
            key = "nats"
        elif first.startswith("python examples/client.py"):
            key = "client"
        else:
            continue
        block = blocks[key] = Block()
        for line in body.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[-1] == "&":
                words = words[:-1]
            if not words:
                continue
            if words[0] == "export":
                block.environ.update(word.split("=", 1) for word in words[1:])  # type: ignore[misc]
            else:
                block.commands.append(words)
    return blocks


class Hosts:
    """The guide's hosts on a Network: its lines turned into this test's addresses and files."""

    def __init__(self, network: Network, workdir: Path) -> None:
        self.network, self.workdir = network, workdir
        self.address = {name: network[name].address for name in GUIDE_ADDRESSES}
        self.blocks = guide()

    def local_address(self, word: str) -> str:
        """A word of the guide with this test's addresses."""
        return re.sub(
            r"10\.0\.0\.(1|21|22)(?!\d)",
            lambda m: self.address[{"1": "a", "21": "b", "22": "c"}[m.group(1)]],
            word,
        )

    def local(self, word: str) -> str:
        """A word of a command of the guide with this test's addresses, programs and folders."""
        word = self.local_address(word)
        return {
            "dynamo-bridge": f"{sys.executable} -m bridge",
            "etcd": require_service("etcd"),
            "nats-server": require_service("nats-server"),
            "python": sys.executable,
            "./models": str(EXAMPLES / "model_repository"),
            "examples/client.py": str(EXAMPLES / "client.py"),
            "/var/lib/etcd": str(self.workdir / "etcd-data"),
        }.get(word, word)

    def command(self, words: list[str]) -> list[str]:
        return [part for word in words for part in self.local(word).split(" ")]

    def environ(self, host: str, plane: str) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if k not in DROPPED}
        environ["PYTHONPATH"] = str(PROJECT_ROOT)
        environ["DYN_LOG"] = "warn"
        environ["DYN_BRIDGE_SHM_HOST_ID"] = f"simulated-host-{host}"  # see the module doc
        guide_environ = dict(self.blocks.get(host, Block()).environ)
        if plane == "nats":
            guide_environ.update(self.blocks["nats"].environ)
        environ.update({k: self.local_address(v) for k, v in guide_environ.items()})
        return environ

    def run_block(self, host: str, plane: str, starts: str) -> HostProcess:
        """Start the command of `host`'s block whose program is `starts`."""
        for words in self.blocks[host].commands:
            if words[0] == starts:
                return self.network[host].spawn(
                    self.command(words),
                    env=self.environ(host, plane),
                    name=starts,
                    log_path=self.workdir / f"{host}-{starts}.log",
                    cwd=self.workdir,
                )
        raise AssertionError(f"the guide's host {host.upper()} block runs no {starts}")


def successes(host: Host, model: str = "add_sub") -> float:
    """nv_inference_request_success of `model` on the worker's metrics port (8002, the guide)."""
    with urllib.request.urlopen(f"http://{host.address}:8002/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "nv_inference_request_success":
            for sample in family.samples:
                if sample.labels.get("model") == model:
                    return float(sample.value)
    return 0.0


def add_sub_inputs() -> list[grpcclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        inputs.append(tensor)
    return inputs


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    require_hosts()
    require_service("etcd")
    require_service("nats-server")
    with Network(["a", "b", "c", "client"], workdir=tmp_path) as network:
        yield Hosts(network, tmp_path)


def start_frontend(
    hosts: Hosts, plane: str
) -> tuple[HostProcess, grpcclient.InferenceServerClient]:
    """Host A's block: etcd, NATS on the nats plane, then the frontend, each once it answers."""
    a = hosts.address["a"]
    hosts.run_block("a", plane, "etcd").wait_port(2379, START_S)
    if plane == "nats":
        hosts.run_block("a", plane, "nats-server").wait_port(4222, START_S)
    frontend = hosts.run_block("a", plane, "dynamo-bridge")
    client = grpcclient.InferenceServerClient(f"{a}:8001")

    def live() -> bool:
        try:
            return bool(client.is_server_live())
        except Exception:  # not listening yet
            return False

    frontend.wait_until(live, "live on gRPC", START_S)
    return frontend, client


def start_worker(hosts: Hosts, host: str, plane: str) -> HostProcess:
    worker = hosts.run_block(host, plane, "dynamo-bridge")
    worker.wait_http(f"http://{hosts.address[host]}:8002/v2/health/ready", 200, START_S)
    return worker


@pytest.mark.parametrize("plane", ["tcp", "nats"])
def test_the_guide_on_three_hosts(hosts: Hosts, plane: str) -> None:
    frontend, client = start_frontend(hosts, plane)
    b, c = start_worker(hosts, "b", plane), start_worker(hosts, "c", plane)
    deadline = time.monotonic() + START_S
    while not all(client.is_model_ready(m) for m in EXAMPLE_MODELS):
        assert time.monotonic() < deadline, "the example models never became ready at the door"
        time.sleep(0.2)

    # The plane the guide chose is the one in use: on nats a worker has no tcp request plane.
    assert accepts(hosts.address["b"], 9600) == (plane == "tcp")

    # The example client, from a fourth host, through the door on A.
    words = hosts.blocks["client"].commands[0]
    done = hosts.network["client"].run(hosts.command(words), env=hosts.environ("client", plane))
    logs = "".join(
        f"\n--- {p.name} on {p.host.name}:\n" + "\n".join(p.log_text().splitlines()[-15:])
        for p in (frontend, b, c)
    )
    assert done.returncode == 0, done.stdout + done.stderr + logs
    for line in (
        "add_sub      OUTPUT0 (sum):        [[5.0, 5.0, 5.0, 5.0], [11.0, 21.0, 31.0, 41.0]]",
        "token_streamer 3 tokens, joined: 'first prompt, streamed'",
        "slow_cancellable stream_timeout: StatusCode.DEADLINE_EXCEEDED",
    ):
        assert line in done.stdout, done.stdout + done.stderr + logs

    # A worker's SIGTERM under load, its replica serving: no request fails.
    url = f"{hosts.address['a']}:8001"
    with LoadGenerator(url, "add_sub", add_sub_inputs, threads=4, max_seconds=120) as load:
        load.wait_for(
            lambda _: successes(hosts.network["b"]) > 0 and successes(hosts.network["c"]) > 0,
            "both workers serving",
        )
        b.terminate()
        assert b.wait_exit(60) == 0, b.log_text()[-3000:]
        # c's count first: every outcome after the snapshot is then one c counted after it (but
        # for the few in flight at the read, counted by c before their client saw them).
        served_by_c = successes(hosts.network["c"])
        after_exit = len(load.snapshot())
        load.wait_for(lambda o: len(o) >= after_exit + 200, "200 more requests after the exit")
    outcomes = load.snapshot()
    assert not load.failures(), describe(outcomes)
    # the replica took them all (less the 4 threads' requests in flight at the reads)
    assert successes(hosts.network["c"]) >= served_by_c + 200 - 4
    assert frontend.running() and c.running()
    assert "Traceback" not in frontend.log_text()
    if plane == "nats":
        # JetStream is not needed: the guide's nats-server runs without -js.
        assert "-js" not in " ".join(hosts.blocks["a"].commands[1])


def test_a_worker_the_frontend_cannot_reach_gets_nothing(hosts: Hosts) -> None:
    # Host C advertises an address on a second network of its own: an address of C (its
    # start-up check passes), out of the frontend's reach.
    hidden = "172.31.213.22"
    hosts.network["c"].add_interface("eth1", f"{hidden}/24")
    hosts.blocks["c"].environ["DYN_TCP_RPC_HOST"] = hidden
    frontend, client = start_frontend(hosts, "tcp")
    c = start_worker(hosts, "c", "tcp")  # ready by its own account, and registered
    line = f"advertises {hidden}:9600 for the request plane, which this process cannot reach"
    # The door asks its workers when asked itself (ModelReady asks a fresh round); C's models
    # are not ready through it, and the line names C's address.
    said = lambda: not client.is_model_ready("add_sub") and line in frontend.log_text()  # noqa: E731
    frontend.wait_until(said, "the line about C", START_S)
    with pytest.raises(Exception, match="add_sub"):
        client.infer("add_sub", add_sub_inputs(), client_timeout=30)

    start_worker(hosts, "b", "tcp")
    deadline = time.monotonic() + START_S
    while not client.is_model_ready("add_sub"):
        assert time.monotonic() < deadline, "add_sub never ready through B"
        time.sleep(0.2)
    for _ in range(40):  # round robin over B and C would send C every other one
        client.infer("add_sub", add_sub_inputs(), client_timeout=30)
    assert successes(hosts.network["b"]) >= 40
    assert successes(hosts.network["c"]) == 0
    assert frontend.log_text().count(line) == 1  # said once
    assert c.running()
