"""The HTTP door's server: uvicorn (httptools) inside the process's own asyncio loop.

The bridge owns the process's signals and its loop (Dynamo's runtime runs on it), so uvicorn
is run as a task of that loop with its signal handling off, and stopped by `stop(grace)`. The
listening socket is bound here, before uvicorn starts, so that a port in use fails `start()`
with an error (uvicorn would exit the process) and port 0 picks a free port (`.port`).

Why this stack (measured on this 2-core machine, busy: an echo of binary FP32 × 4 / 100K / 1M
at concurrency 1, and × 4 at 32): Starlette's routing costs little over a raw ASGI app on
uvicorn (p50 0.22 vs 0.19-0.27 ms at × 4; the large sizes were within the noise), and granian
embedded in the loop was slower at concurrency 1 (0.49-0.62 ms at × 4) for no clear gain.

TLS: tritonserver has no TLS on its HTTP port, so the flags are the bridge's, named as its gRPC
ones: `--http-use-ssl` with `--http-server-cert` / `--http-server-key`, `--http-use-ssl-mutual`
to require a client certificate signed by `--http-root-cert`. The files are read at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn

from ....restrictions import Restriction
from ..service import TritonService
from .app import make_app
from .limits import DEFAULT_MAX_INPUT_SIZE
from .security import Protocol

log = logging.getLogger("dynamo_bridge")
KEEP_ALIVE_SECONDS = 75


@dataclass(frozen=True, slots=True)
class HttpOptions:
    port: int = 8000
    address: str = "127.0.0.1"
    # `--http-restricted-api`: {api group: header its requests must carry} (security.py)
    restricted: dict[str, Restriction] = field(default_factory=dict)
    # The control port (`--control-port`): the repository and health routes only, every one
    # guarded as a load is (security.py).
    control: bool = False
    # `--http-allowed-hosts`: the Host names the door answers to (None: loopback names on a
    # loopback address, any elsewhere; security.py), and `--http-max-input-size` (limits.py).
    allowed_hosts: tuple[str, ...] | None = None
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    # TLS (`--http-use-ssl`, `--http-use-ssl-mutual`, `--http-server-cert`, `--http-server-key`,
    # `--http-root-cert`: the bridge's names, in the style of tritonserver's gRPC ones).
    use_ssl: bool = False
    use_ssl_mutual: bool = False
    server_cert: Path | None = None
    server_key: Path | None = None
    root_cert: Path | None = None


class HttpConfigError(ValueError):
    """The HTTP door cannot start with these options (e.g. its port is taken)."""


class _EmbeddedServer(uvicorn.Server):
    """uvicorn.Server that leaves the process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address.strip("[]"), port))
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise HttpConfigError(
            f"cannot serve HTTP on {address}:{port}: {exc.strerror or exc}"
        ) from None
    return sock


def check_address(options: HttpOptions) -> None:
    """Fail early (HttpConfigError) when the address cannot be bound or the TLS files do not
    load: before any model loads, as tritonserver fails its start-up. The real bind is
    `start()`'s."""
    tls_context(options)
    _bind(options.address, options.port).close()


def _readable(path: Path | None, flag: str) -> Path:
    if path is None:
        raise HttpConfigError(f"{flag} is required for TLS on the HTTP port")
    if not path.is_file() or not os.access(path, os.R_OK):
        raise HttpConfigError(f"{flag}: cannot read '{path}'")
    return path


def tls_context(options: HttpOptions) -> ssl.SSLContext | None:
    """The TLS context the options ask for (None: plain HTTP); HttpConfigError when a file is
    missing or does not load. Mutual TLS requires a client certificate signed by the root."""
    if not (options.use_ssl or options.use_ssl_mutual):
        return None
    cert = _readable(options.server_cert, "--http-server-cert")
    key = _readable(options.server_key, "--http-server-key")
    root = _readable(options.root_cert, "--http-root-cert") if options.root_cert else None
    if options.use_ssl_mutual and root is None:
        raise HttpConfigError("--http-use-ssl-mutual needs --http-root-cert")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
        if root is not None:
            context.load_verify_locations(root)
    except ssl.SSLError as exc:
        raise HttpConfigError(f"the HTTP port's TLS files do not load: {exc}") from None
    if options.use_ssl_mutual:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class HttpServer:
    """Triton's HTTP/REST API over a `TritonService`."""

    def __init__(self, service: TritonService, options: HttpOptions) -> None:
        self.options = options
        self.app = make_app(service, options)
        self.port = 0
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    def _config(self) -> uvicorn.Config:
        context = tls_context(self.options)
        return uvicorn.Config(
            self.app,
            ssl_context_factory=(lambda config, default: context) if context else None,
            host=self.options.address,
            port=self.options.port,
            loop="none",  # the running loop (the runtime's)
            http=Protocol,  # httptools, with a deadline for request heads (security.py)
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,  # the bridge configured logging
            access_log=False,
            server_header=False,
            backlog=2048,
            # Clients keep one connection for their whole run (tritonclient, perf_analyzer);
            # uvicorn's 5 s default would close it between bursts.
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
        )

    async def start(self) -> None:
        """Listen and serve; returns once connections are accepted. HttpConfigError when the
        address cannot be bound."""
        # uvicorn's own start and stop lines ("Started server process") would read as the
        # bridge's; its warnings and errors still show.
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
        sock = _bind(self.options.address, self.options.port)
        self.port = sock.getsockname()[1]
        server = self._server = _EmbeddedServer(self._config())
        self._task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started:  # uvicorn has no event for it; it sets the flag
            if self._task.done():
                self._task.result()  # its failure, raised here
                raise HttpConfigError("the HTTP server stopped while starting")
            await asyncio.sleep(0.005)
        log.info("serving Triton HTTP on %s:%d", self.options.address, self.port)

    async def stop(self, grace: float = 1.0) -> None:
        """Stop accepting; requests in flight get `grace` seconds to finish."""
        server, task = self._server, self._task
        if server is None or task is None:
            return
        server.config.timeout_graceful_shutdown = max(round(grace), 0)  # uvicorn: whole seconds
        server.should_exit = True
        await task
        self._server = self._task = None

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)
