"""Real etcd and nats-server for the cluster tests: installed when missing, run on free ports.

Both are Debian packages (`etcd-server`, `nats-server`). `ensure_binary` finds a server or
installs it with apt-get (as root, or through `sudo -n`). When that fails the tests must not turn
into skips in CI: `ServiceUnavailable` is raised, and `require_service` fails the test under
CI=true and skips it elsewhere (the same rule as the Triton oracle).

`EtcdServer` and `NatsServer` each start one server in a temp dir on free 127.0.0.1 ports, wait
until it answers its health check, and stop (SIGTERM, then SIGKILL of its process group) only
the process they started. `EtcdServer.restart()` brings a stopped etcd back on the same address
and data (an outage).

Auth: `EtcdServer.enable_auth(user, password)` turns etcd's auth on (a root user, and `user` with
readwrite on every key, as docs/security.md says); `NatsServer(users={user: password})` starts
NATS with those users only. Each has `auth_environ()`: Dynamo's variables for those credentials.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import pytest

from .oracle import in_ci
from .ports import LOCALHOST, free_ports
from .process import stop_process_group

# binary -> Debian package holding it
PACKAGES = {"etcd": "etcd-server", "nats-server": "nats-server"}
# apt installs nats-server in /usr/sbin, which a non-root PATH often lacks.
_EXTRA_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin")
_INSTALL_TIMEOUT = 600.0
_STARTUP_TIMEOUT = 30.0


class ServiceUnavailable(RuntimeError):
    """A server binary is missing and could not be installed; the message says why."""


def find_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in _EXTRA_DIRS:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(
        [*prefix, "apt-get", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=_INSTALL_TIMEOUT,
        check=False,
    )


def ensure_binary(name: str) -> str:
    """The path of `name` (etcd or nats-server), installing its package with apt-get if needed."""
    found = find_binary(name)
    if found:
        return found
    package = PACKAGES[name]
    if shutil.which("apt-get") is None:
        raise ServiceUnavailable(f"{name} is not installed and there is no apt-get to install it")
    for args in (("update",), ("install", "-y", "--no-install-recommends", package)):
        try:
            done = _apt(*args)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceUnavailable(f"apt-get {' '.join(args)} failed: {exc}") from exc
        if done.returncode != 0:
            raise ServiceUnavailable(
                f"apt-get {' '.join(args)} exited with {done.returncode}:\n"
                f"{(done.stdout + done.stderr)[-2000:]}"
            )
    found = find_binary(name)
    if found is None:
        raise ServiceUnavailable(f"installed {package} but found no {name} binary")
    return found


def require_service(name: str) -> str:
    """ensure_binary for a test: fail under CI=true, skip elsewhere, when it cannot be had."""
    try:
        return ensure_binary(name)
    except ServiceUnavailable as exc:
        if in_ci():
            pytest.fail(f"{name} is required in CI: {exc}", pytrace=False)
        pytest.skip(f"{name} unavailable: {exc}")


def _http_ok(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return response.read().decode(errors="replace") if response.status == 200 else None
    except (OSError, urllib.error.URLError):
        return None


class _Service:
    """One server subprocess in its own process group, with a data dir of its own."""

    name = "service"

    def __init__(self, binary: str, workdir: str | os.PathLike[str] | None = None) -> None:
        self.binary = binary
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"{self.name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self) -> Self:
        # A port picked as free may be taken before the server binds it: retry on new ports.
        for attempt in range(3):
            command = self.command()
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=self.workdir,
                    start_new_session=True,
                )
            deadline = time.monotonic() + _STARTUP_TIMEOUT
            while not self.ready():
                if self.process.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            else:
                return self
            self.stop()
            if attempt == 2 or "address already in use" not in self.log_text().lower():
                raise RuntimeError(
                    f"{self.name} did not start; log {self.log_path}:\n{self.log_text()[-3000:]}"
                )
        raise AssertionError("unreachable")

    def stop(self) -> None:
        if self.process is not None:
            stop_process_group(self.process, 10.0)
            self.process = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class EtcdServer(_Service):
    """`etcd` (3.4) serving clients on 127.0.0.1:client_port; `endpoint` is ETCD_ENDPOINTS."""

    name = "etcd"

    def __init__(self, workdir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(ensure_binary("etcd"), workdir)
        self.client_port = self.peer_port = 0
        self._same_ports = False
        self.credentials: tuple[str, str] | None = None  # set by enable_auth()

    def enable_auth(self, user: str, password: str) -> EtcdServer:
        """etcd's auth on (kept in its data: a restart keeps it): a root user (etcd requires
        one), and `user` with a role allowed to read and write Dynamo's keys (`v1/…`) only, as
        docs/security.md sets it up."""
        root = secrets.token_hex(8)
        prefix = {"key": _b64("v1/"), "range_end": _b64("v10")}  # "v1/" up to "v10": v1/…
        for path, body in (
            ("auth/role/add", {"name": "root"}),
            ("auth/user/add", {"name": "root", "password": root}),
            ("auth/user/grant", {"user": "root", "role": "root"}),
            ("auth/role/add", {"name": "dynamo"}),
            ("auth/role/grant", {"name": "dynamo", "perm": {"permType": "READWRITE", **prefix}}),
            ("auth/user/add", {"name": user, "password": password}),
            ("auth/user/grant", {"user": user, "role": "dynamo"}),
            ("auth/enable", {}),
        ):
            etcd_call(self.endpoint, path, body)
        self.credentials = (user, password)
        return self

    def auth_environ(self) -> dict[str, str]:
        """ETCD_AUTH_USERNAME and ETCD_AUTH_PASSWORD for enable_auth()'s user."""
        assert self.credentials is not None, "enable_auth() first"
        user, password = self.credentials
        return {"ETCD_AUTH_USERNAME": user, "ETCD_AUTH_PASSWORD": password}

    def restart(self) -> EtcdServer:
        """Start again after stop(), on the same ports and data dir: etcd back after an outage
        (its clients were told this address; the leases it held are restored)."""
        self._same_ports = True
        try:
            self.start()
        finally:
            self._same_ports = False
        return self

    @property
    def endpoint(self) -> str:
        return f"http://{LOCALHOST}:{self.client_port}"

    def command(self) -> list[str]:
        if not self._same_ports:
            self.client_port, self.peer_port = free_ports(2)
        peer = f"http://{LOCALHOST}:{self.peer_port}"
        data = self.workdir / f"data-{self.client_port}"
        return [
            self.binary,
            "--name", "bridge-test",
            "--data-dir", str(data),
            "--listen-client-urls", self.endpoint,
            "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"bridge-test={peer}",
        ]  # fmt: skip

    def ready(self) -> bool:
        body = _http_ok(f"{self.endpoint}/health")
        return body is not None and '"health":"true"' in body.replace(" ", "")


class NatsServer(_Service):
    """`nats-server -js` on 127.0.0.1:port; `url` is NATS_SERVER. With `users`, a client must log
    in as one of them (a config file of the server's own)."""

    name = "nats"

    def __init__(
        self, workdir: str | os.PathLike[str] | None = None, users: dict[str, str] | None = None
    ) -> None:
        super().__init__(ensure_binary("nats-server"), workdir)
        self.port = self.monitor_port = 0
        self.users = dict(users or {})

    def auth_environ(self) -> dict[str, str]:
        """NATS_AUTH_USERNAME and NATS_AUTH_PASSWORD for the first user."""
        user, password = next(iter(self.users.items()))
        return {"NATS_AUTH_USERNAME": user, "NATS_AUTH_PASSWORD": password}

    def _config(self) -> list[str]:
        """`-c FILE` naming the users, or nothing without them."""
        if not self.users:
            return []
        users = ", ".join(
            f"{{user: {json.dumps(u)}, password: {json.dumps(p)}}}" for u, p in self.users.items()
        )
        config = self.workdir / "nats.conf"
        config.write_text(f"authorization {{ users = [ {users} ] }}\n")
        config.chmod(0o600)
        return ["-c", str(config)]

    @property
    def url(self) -> str:
        return f"nats://{LOCALHOST}:{self.port}"

    def command(self) -> list[str]:
        self.port, self.monitor_port = free_ports(2)
        return [
            self.binary,
            "-a", LOCALHOST,
            "-p", str(self.port),
            "-m", str(self.monitor_port),
            "-js",
            "-sd", str(self.workdir / f"js-{self.port}"),
            *self._config(),
        ]  # fmt: skip

    def ready(self) -> bool:
        # /healthz answers 200 once the client port and JetStream are up.
        return _http_ok(f"http://{LOCALHOST}:{self.monitor_port}/healthz") is not None


def etcd_call(
    endpoint: str, path: str, body: Mapping[str, object], token: str | None = None
) -> dict[str, Any]:
    """POST `body` to etcd's v3 JSON gateway at `/v3/<path>`; its answer (HTTPError on an
    error)."""
    request = urllib.request.Request(
        f"{endpoint}/v3/{path}", data=json.dumps(body).encode(), method="POST"
    )
    if token:
        request.add_header("Authorization", token)
    with urllib.request.urlopen(request, timeout=5) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _token(endpoint: str, auth: tuple[str, str] | None) -> str | None:
    if auth is None:
        return None
    user, password = auth
    answer = etcd_call(endpoint, "auth/authenticate", {"name": user, "password": password})
    return str(answer["token"])


def etcd_keys(endpoint: str, auth: tuple[str, str] | None = None, prefix: str = "") -> list[str]:
    """Every key in etcd (under `prefix`), through its v3 JSON gateway (no etcdctl needed), as
    user `auth`."""
    # A prefix's range ends where its last byte is one more; "\0" to "\0" is every key.
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\0"
    body = {"key": _b64(prefix or "\0"), "range_end": _b64(end), "keys_only": True}
    reply = etcd_call(endpoint, "kv/range", body, _token(endpoint, auth))
    return [base64.b64decode(kv["key"]).decode(errors="replace") for kv in reply.get("kvs", [])]


def revoke_leases(endpoint: str, auth: tuple[str, str] | None = None) -> int:
    """Revoke every lease etcd holds, as any client of an etcd without auth may (issue 38
    finding 5); how many there were."""
    token = _token(endpoint, auth)
    leases = etcd_call(endpoint, "lease/leases", {}, token).get("leases", [])
    for lease in leases:
        etcd_call(endpoint, "lease/revoke", {"ID": lease["ID"]}, token)
    return len(leases)


def nats_connections(server: NatsServer) -> int:
    """How many clients are connected to `server` now (its monitoring /connz)."""
    body = _http_ok(f"http://{LOCALHOST}:{server.monitor_port}/connz")
    return int(json.loads(body)["num_connections"]) if body else 0
