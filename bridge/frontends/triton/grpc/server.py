"""The gRPC server of the triton door's gRPC wire: address, TLS, message sizes, methods.

As tritonserver: `--grpc-address` is honoured (127.0.0.1 unless told otherwise), TLS with
`--grpc-use-ssl` / `--grpc-server-cert` / `--grpc-server-key` / `--grpc-root-cert`, client
certificates required with `--grpc-use-ssl-mutual`, and messages of up to INT32_MAX bytes both
ways by default (Triton's MAX_GRPC_MESSAGE_SIZE, src/grpc/grpc_server.cc `SetMaxMessageSize`,
which no flag of tritonserver changes [S]; gRPC's default would cap requests at 4 MiB).
`--grpc-max-message-size` lowers it: a request in flight is held in a few copies (gRPC's
buffer, the protobuf, the model's input), so this bounds what one client can make the door
allocate.

At most `--grpc-max-connections` connections at once (gRPC core's
`grpc.max_allowed_incoming_connections`: it closes the ones beyond), so that connections cannot
take every file descriptor of the process from the other listeners (issue 22: 20,000 of them
stopped gRPC, HTTP, metrics and the request plane). tritonserver has no such flag; by default
the cap is what the open-file limit leaves (bridge/server.py), since gRPC core cannot make room
by closing an idle connection and a small cap let idle connections lock every new client out
(issue 38). Idle connections are closed after `--grpc-max-connection-idle`, and keepalive and
connection age follow tritonserver's flags (connections.py). A connection must also finish its
handshake (TLS, and the client's HTTP/2 preface and SETTINGS) within HANDSHAKE_TIMEOUT_S, not
gRPC's 120 s, so connections that send nothing do not hold places for long.

A synchronous `grpc.server`, not grpc.aio: its per-call cost is about half of grpc.aio's, and
ModelInfer to this process's own models runs on the call's thread without the event loop
(issue 37, docs/benchmarks.md). Which RPC runs on which bounded pool of threads, and the method
table, are methods.py's; the asynchronous handlers that stay on the loop are reached through
on_loop.py.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from ....restrictions import Restriction
from ....tuning import grpc_experiments, threads_on
from ..header_forward import HeaderForwarding
from ..service import TritonService
from .connections import ConnectionPolicy
from .methods import INFER_THREADS, MAX_STREAMS, Threads, method_handlers
from .restrictions import RestrictedProtocols
from .servicer import STREAM_REQUESTS, TritonServicer

log = logging.getLogger("dynamo_bridge")

MAX_MESSAGE_SIZE = 2**31 - 1  # Triton's MAX_GRPC_MESSAGE_SIZE (INT32_MAX), both directions
# --grpc-max-connections by default when the open-file limit leaves fewer (bridge/server.py
# warns then); else the default is what that limit leaves.
LEAST_CONNECTIONS = 1024
# Ample for a TLS handshake over a slow link; gRPC's own default is 120 s.
HANDSHAKE_TIMEOUT_S = 10.0
# At the end of a shutdown, once the calls in flight have finished: for answers already on their
# way out to leave (a loopback or LAN write takes milliseconds; this is not a drain).
LAST_ANSWERS_S = 0.5


@dataclass(frozen=True, slots=True)
class DoorOptions:
    port: int = 8001
    address: str = "127.0.0.1"
    namespace: str = "dynamo_bridge"
    max_message_size: int = MAX_MESSAGE_SIZE  # `--grpc-max-message-size`, both directions
    use_ssl: bool = False
    use_ssl_mutual: bool = False
    server_cert: Path | None = None
    server_key: Path | None = None
    root_cert: Path | None = None
    # `--grpc-restricted-protocol`: {protocol group: header its calls must carry}
    restricted: dict[str, Restriction] = field(default_factory=dict)
    # `--grpc-max-connections`; None: no cap of its own (the composition root sets what the
    # open-file limit leaves).
    max_connections: int | None = None
    # `--grpc-max-streams`: ModelStreamInfer calls open at once (two threads each)
    max_streams: int = MAX_STREAMS
    # `--grpc-stream-requests`: requests of one stream in flight at once (servicer.py)
    stream_requests: int = STREAM_REQUESTS
    # `--grpc-infer-threads`: ModelInfer calls answered at once (methods.py)
    infer_threads: int = INFER_THREADS
    # `--grpc-thread-cpu`: the CPU the server's threads run on (tuning.py); None: any
    thread_cpu: int | None = None
    # `--grpc-keepalive-*`, `--grpc-max-connection-*` (connections.py)
    connection_policy: ConnectionPolicy = field(default_factory=ConnectionPolicy)
    # `--grpc-header-forward-pattern` (header_forward.py); None: no header is forwarded.
    header_forwarding: HeaderForwarding | None = None


class DoorConfigError(ValueError):
    """The door cannot start with these options (e.g. TLS without a certificate)."""


def _read(path: Path | None, flag: str) -> bytes:
    if path is None:
        raise DoorConfigError(f"--grpc-use-ssl needs {flag}")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise DoorConfigError(f"{flag}: cannot read '{path}': {exc.strerror}") from None


def credentials(options: DoorOptions) -> grpc.ServerCredentials | None:
    """The TLS credentials the options ask for; None for plaintext."""
    if not (options.use_ssl or options.use_ssl_mutual):
        return None
    key = _read(options.server_key, "--grpc-server-key")
    cert = _read(options.server_cert, "--grpc-server-cert")
    root = _read(options.root_cert, "--grpc-root-cert") if options.root_cert else None
    if options.use_ssl_mutual and root is None:
        raise DoorConfigError("--grpc-use-ssl-mutual needs --grpc-root-cert")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=root, require_client_auth=options.use_ssl_mutual
    )


class GrpcServer:
    """Triton's gRPC service over a `TritonService`."""

    def __init__(self, service: TritonService, options: DoorOptions) -> None:
        self.options = options
        self._servicer = TritonServicer(service, options.header_forwarding, options.stream_requests)
        self._server: grpc.Server | None = None
        self._threads: Threads | None = None
        self._stopped = asyncio.Event()
        self.port = 0

    def _channel_args(self) -> list[tuple[str, int]]:
        options = self.options
        args = [
            ("grpc.max_receive_message_length", options.max_message_size),
            ("grpc.max_send_message_length", options.max_message_size),
            ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000)),
            # grpc's default lets a second server bind the same port and take half the
            # connections; a taken port must fail the start-up instead.
            ("grpc.so_reuseport", 0),
            *options.connection_policy.channel_args(),
        ]
        if options.max_connections is not None:
            args.append(("grpc.max_allowed_incoming_connections", options.max_connections))
        return args

    async def start(self) -> None:
        creds = credentials(self.options)  # before anything listens: bad TLS files fail start
        interceptors: list[grpc.ServerInterceptor] = (
            [RestrictedProtocols(self.options.restricted)] if self.options.restricted else []
        )
        threads = Threads(self.options.max_streams, self.options.infer_threads)
        server = grpc.server(
            threads.infer,
            interceptors=interceptors,
            options=self._channel_args(),
            maximum_concurrent_rpcs=threads.max_calls,
        )
        loop = asyncio.get_running_loop()
        server.add_generic_rpc_handlers((method_handlers(self._servicer, loop, threads),))
        address = f"{self.options.address}:{self.options.port}"
        if ":" in self.options.address and not self.options.address.startswith("["):
            address = f"[{self.options.address}]:{self.options.port}"
        try:
            if creds is None:
                self.port = server.add_insecure_port(address)
            else:
                self.port = server.add_secure_port(address, creds)
        except RuntimeError:  # "Failed to bind to address ...": the port is taken
            threads.shutdown()
            raise
        with threads_on(self.options.thread_cpu):  # the server's threads start now
            server.start()
        self._server = server
        self._threads = threads
        self._stopped = asyncio.Event()
        experiments = grpc_experiments()
        log.info(
            "serving Triton gRPC on %s:%d%s%s%s",
            self.options.address,
            self.port,
            " (TLS, client certificates required)"
            if self.options.use_ssl_mutual
            else " (TLS)"
            if creds is not None
            else "",
            ""
            if self.options.thread_cpu is None
            else f", its threads on CPU {self.options.thread_cpu}",
            f", GRPC_EXPERIMENTS={experiments}" if experiments else "",
        )

    async def stop(self, grace: float = 1.0) -> None:
        """Shut down as tritonserver does: calls go on being answered (health with UNAVAILABLE
        "Server exiting", new inference refused with Triton's texts, service.py) while the
        inference calls in flight finish, for at most `grace` s; then the server stops."""
        if self._server is None:
            return
        service = self._servicer.service
        service.begin_exit()
        await service.calls.wait_idle(grace)
        # What is left: idle streams, calls past the grace, answers of refused calls on their
        # way out (given a moment). The loop stays free meanwhile: the calls' threads may be
        # waiting for it.
        stopped = self._server.stop(LAST_ANSWERS_S)
        await asyncio.get_running_loop().run_in_executor(None, stopped.wait)
        if self._threads is not None:
            self._threads.shutdown()
        self._server = None
        self._stopped.set()

    async def wait(self) -> None:
        if self._server is not None:
            await self._stopped.wait()
