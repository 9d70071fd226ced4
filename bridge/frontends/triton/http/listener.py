"""One HTTP listener: an ASGI app served by uvicorn (httptools) inside the process's own loop.

The bridge owns the process's signals and its loop (Dynamo's runtime runs on it), so uvicorn
is run as a task of that loop with its signal handling off, and stopped by `stop(grace)`. The
listening socket is bound here, before uvicorn starts, so that a port in use fails `start()`
with an error (uvicorn would exit the process) and port 0 picks a free port (`.port`). Every
connection runs under the listener's `ConnectionLimits` (connections.py).

The triton door's HTTP port, the control port and the metrics port are each one of these.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp

from .connections import ConnectionLimits, protocol_class

BACKLOG = 2048


class ListenerError(ValueError):
    """The listener cannot start (e.g. its port is taken)."""


class _EmbeddedServer(uvicorn.Server):
    """uvicorn.Server that leaves the process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(address: str, port: int, what: str = "HTTP") -> socket.socket:
    """A listening socket on address:port; ListenerError when it cannot be bound."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address.strip("[]"), port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ListenerError(
            f"cannot serve {what} on {address}:{port}: {exc.strerror or exc}"
        ) from None
    return sock


class Listener:
    """`app` on `address:port` under `limits`, until `stop()`."""

    def __init__(
        self,
        app: ASGIApp,
        address: str,
        port: int,
        limits: ConnectionLimits,
        ssl_context: ssl.SSLContext | None = None,
        what: str = "HTTP",
    ) -> None:
        self.app = app
        self.address = address
        self.port = port
        self.limits = limits
        self.ssl_context = ssl_context
        self.what = what
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    def _config(self) -> uvicorn.Config:
        context = self.ssl_context
        return uvicorn.Config(
            self.app,
            ssl_context_factory=(lambda config, default: context) if context else None,
            host=self.address,
            port=self.port,
            loop="none",  # the running loop (the runtime's)
            http=protocol_class(self.limits),  # httptools, with deadlines and a cap
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,  # the bridge configured logging
            access_log=False,
            server_header=False,
            # Triton reads no X-Forwarded-* header, and nothing here should believe a local
            # client's word for its address: uvicorn's rewriting middleware stays out.
            proxy_headers=False,
            backlog=BACKLOG,
            timeout_keep_alive=self.limits.keep_alive_timeout,  # type: ignore[arg-type]
        )

    async def start(self) -> None:
        """Listen and serve; returns once connections are accepted. ListenerError when the
        address cannot be bound."""
        # uvicorn's own start and stop lines ("Started server process") would read as the
        # bridge's; its warnings and errors still show.
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
        sock = bind(self.address, self.port, self.what)
        self.port = sock.getsockname()[1]
        server = self._server = _EmbeddedServer(self._config())
        self._task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started:  # uvicorn has no event for it; it sets the flag
            if self._task.done():
                self._task.result()  # its failure, raised here
                raise ListenerError(f"the {self.what} server stopped while starting")
            await asyncio.sleep(0.005)

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
