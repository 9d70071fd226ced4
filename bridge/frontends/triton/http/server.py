"""The HTTP door's server: Triton's HTTP/REST API (make_app) on one `Listener` (listener.py:
uvicorn with httptools inside the process's own loop, under the connection limits of
connections.py).

Why this stack (measured on this 2-core machine, busy: an echo of binary FP32 × 4 / 100K / 1M
at concurrency 1, and × 4 at 32): Starlette's routing costs little over a raw ASGI app on
uvicorn (p50 0.22 vs 0.19-0.27 ms at × 4; the large sizes were within the noise), and granian
embedded in the loop was slower at concurrency 1 (0.49-0.62 ms at × 4) for no clear gain.

TLS: tritonserver has no TLS on its HTTP port, so the flags are the bridge's, named as its gRPC
ones: `--http-use-ssl` with `--http-server-cert` / `--http-server-key`, `--http-use-ssl-mutual`
to require a client certificate signed by `--http-root-cert`. The files are read at start-up.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from ....restrictions import Restriction
from ..header_forward import HeaderForwarding
from ..service import TritonService
from .app import make_app
from .connections import ConnectionLimits
from .limits import DEFAULT_MAX_INPUT_SIZE
from .listener import Listener, ListenerError, bind

log = logging.getLogger("dynamo_bridge")

# The name the roles catch: the HTTP port cannot start with these options (its port is taken,
# a TLS file does not load).
HttpConfigError = ListenerError


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
    # Deadlines, keep-alive and the connection cap (`--http-header-timeout-secs`, ...).
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    # `--http-header-forward-pattern` (header_forward.py); None: no header is forwarded.
    header_forwarding: HeaderForwarding | None = None


def check_address(options: HttpOptions) -> None:
    """Fail early (HttpConfigError) when the address cannot be bound or the TLS files do not
    load: before any model loads, as tritonserver fails its start-up. The real bind is
    `start()`'s."""
    tls_context(options)
    bind(options.address, options.port).close()


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
        self._listener: Listener | None = None

    @property
    def port(self) -> int:
        return self._listener.port if self._listener is not None else 0

    async def start(self) -> None:
        """Listen and serve; returns once connections are accepted. HttpConfigError when the
        address cannot be bound."""
        listener = Listener(
            self.app,
            self.options.address,
            self.options.port,
            self.options.limits,
            tls_context(self.options),
        )
        await listener.start()
        self._listener = listener
        log.info("serving Triton HTTP on %s:%d", self.options.address, self.port)

    async def stop(self, grace: float = 1.0) -> None:
        """Stop accepting; requests in flight get `grace` seconds to finish."""
        if self._listener is not None:
            await self._listener.stop(grace)

    async def wait(self) -> None:
        if self._listener is not None:
            await self._listener.wait()
