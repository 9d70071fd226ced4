"""The HTTP door's server: uvicorn (httptools) inside the process's own asyncio loop.

The bridge owns the process's signals and its loop (Dynamo's runtime runs on it), so uvicorn
is run as a task of that loop with its signal handling off, and stopped by `stop(grace)`. The
listening socket is bound here, before uvicorn starts, so that a port in use fails `start()`
with an error (uvicorn would exit the process) and port 0 picks a free port (`.port`).

Why this stack (measured on this 2-core machine, busy: an echo of binary FP32 × 4 / 100K / 1M
at concurrency 1, and × 4 at 32): Starlette's routing costs little over a raw ASGI app on
uvicorn (p50 0.22 vs 0.19-0.27 ms at × 4; the large sizes were within the noise), and granian
embedded in the loop was slower at concurrency 1 (0.49-0.62 ms at × 4) for no clear gain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn

from ..service import TritonService
from .app import make_app

log = logging.getLogger("dynamo_bridge")
KEEP_ALIVE_SECONDS = 75


@dataclass(frozen=True, slots=True)
class HttpOptions:
    port: int = 8000
    address: str = "127.0.0.1"


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
    """Fail early (HttpConfigError) when the address cannot be bound: before any model loads,
    as tritonserver fails its start-up. The real bind is `start()`'s."""
    _bind(options.address, options.port).close()


class HttpServer:
    """Triton's HTTP/REST API over a `TritonService`."""

    def __init__(self, service: TritonService, options: HttpOptions) -> None:
        self.options = options
        self.app = make_app(service, options)
        self.port = 0
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    def _config(self) -> uvicorn.Config:
        return uvicorn.Config(
            self.app,
            host=self.options.address,
            port=self.options.port,
            loop="none",  # the running loop (the runtime's)
            http="httptools",
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
