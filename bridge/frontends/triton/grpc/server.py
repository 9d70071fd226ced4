"""The gRPC server of the triton door's gRPC wire: address, TLS, message sizes, methods.

As tritonserver: `--grpc-address` is honoured (127.0.0.1 unless told otherwise), TLS with
`--grpc-use-ssl` / `--grpc-server-cert` / `--grpc-server-key` / `--grpc-root-cert`, client
certificates required with `--grpc-use-ssl-mutual`, and messages of up to INT32_MAX bytes both
ways by default (Triton's MAX_GRPC_MESSAGE_SIZE, src/grpc/grpc_server.cc `SetMaxMessageSize`,
which no flag of tritonserver changes [S]; gRPC's default would cap requests at 4 MiB).
`--grpc-max-message-size` lowers it: a request in flight is held in a few copies (gRPC's
buffer, the protobuf, the bridge form), so this bounds what one client can make the door
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

The method table is built from the service descriptor in tritonclient's generated module, with
two changes: a request that is not a valid protobuf deserializes to a marker, so the RPC answers
Triton's INTERNAL "Unable to parse request" (and a stream carries it in-band and goes on)
instead of gRPC's own failure; and an inference request's tensor bytes are read without the
parser's copies, and large answers' without the serializer's (wire.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from ....restrictions import Restriction
from ..header_forward import HeaderForwarding
from ..service import TritonService
from .connections import ConnectionPolicy
from .on_loop import on_loop_stream, on_loop_unary
from .restrictions import RestrictedProtocols
from .servicer import TritonServicer
from .unary import ModelInferOnThread
from .wire import MALFORMED, read_infer_request, write_infer_response, write_stream_response

log = logging.getLogger("dynamo_bridge")

SERVICE = "inference.GRPCInferenceService"
MAX_MESSAGE_SIZE = 2**31 - 1  # Triton's MAX_GRPC_MESSAGE_SIZE (INT32_MAX), both directions
# --grpc-max-connections by default when the open-file limit leaves fewer (bridge/server.py
# warns then); else the default is what that limit leaves.
LEAST_CONNECTIONS = 1024
# Ample for a TLS handshake over a slow link; gRPC's own default is 120 s.
HANDSHAKE_TIMEOUT_S = 10.0
# At the end of a shutdown, once the calls in flight have finished: for answers already on their
# way out to leave (a loopback or LAN write takes milliseconds; this is not a drain).
LAST_ANSWERS_S = 0.5
# Threads for unary calls. ModelInfer to this process's own models holds its thread while the
# model works (unary.py), so there must be room for a batcher's worth of requests at once; a
# thread with nothing to do is parked, and calls beyond wait for one.
UNARY_THREADS = 256
# ModelStreamInfer calls open at once unless `--grpc-max-streams` says. A stream holds two
# threads (one sends its answers, one reads its requests) for as long as it is open, on pools of
# their own, so that streams never take the unary calls' threads; a stream past the limit is
# refused with RESOURCE_EXHAUSTED.
MAX_STREAMS = 1024


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
    # `--grpc-keepalive-*`, `--grpc-max-connection-*` (connections.py)
    connection_policy: ConnectionPolicy = field(default_factory=ConnectionPolicy)
    # `--grpc-header-forward-pattern` (header_forward.py); None: no header is forwarded.
    header_forwarding: HeaderForwarding | None = None


class DoorConfigError(ValueError):
    """The door cannot start with these options (e.g. TLS without a certificate)."""


def _tolerant(message: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except DecodeError:
            return MALFORMED

    return parse


_WRITERS: dict[type, Callable[[Any], bytes]] = {
    pb.ModelInferResponse: write_infer_response,
    pb.ModelStreamInferResponse: write_stream_response,
}


class _StreamSeats:
    """At most `limit` ModelStreamInfer calls open at once, each with its two threads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free = threading.BoundedSemaphore(limit)
        # A stream's answers are sent from its call's thread; beyond the seats a few more
        # threads, so that a refusal never waits behind the open streams.
        self.calls = futures.ThreadPoolExecutor(limit + 4, thread_name_prefix="grpc-stream")
        self.readers = futures.ThreadPoolExecutor(limit, thread_name_prefix="grpc-stream-read")

    def seated(self, handle: Callable[[Any, Any], Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            if not self._free.acquire(blocking=False):
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"too many open streams: the server takes at most {self.limit} at once",
                )
            try:
                yield from handle(requests, context)
            finally:
                self._free.release()

        stream.experimental_thread_pool = self.calls  # type: ignore[attr-defined]
        return stream

    def shutdown(self) -> None:
        self.calls.shutdown(wait=False, cancel_futures=True)
        self.readers.shutdown(wait=False, cancel_futures=True)


def _handlers(
    servicer: TritonServicer, loop: asyncio.AbstractEventLoop, seats: _StreamSeats
) -> grpc.GenericRpcHandler:
    methods = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request = getattr(pb, method.input_type.name)
        response = getattr(pb, method.output_type.name)
        # ModelInfer and ModelStreamInfer: their tensor bytes are copied as little as possible.
        read = read_infer_request if request is pb.ModelInferRequest else _tolerant(request)
        write = _WRITERS.get(response, response.SerializeToString)
        handler = getattr(servicer, method.name)
        if method.name == "ModelInfer":
            methods[method.name] = grpc.unary_unary_rpc_method_handler(
                ModelInferOnThread(servicer, loop),
                request_deserializer=read,
                response_serializer=write,
            )
        elif method.client_streaming:
            stream = seats.seated(on_loop_stream(handler, loop, seats.readers))
            methods[method.name] = grpc.stream_stream_rpc_method_handler(
                stream, request_deserializer=read, response_serializer=write
            )
        else:
            methods[method.name] = grpc.unary_unary_rpc_method_handler(
                on_loop_unary(handler, loop), request_deserializer=read, response_serializer=write
            )
    return grpc.method_handlers_generic_handler(SERVICE, methods)


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
        self._servicer = TritonServicer(service, options.header_forwarding)
        self._server: grpc.Server | None = None
        self._seats: _StreamSeats | None = None
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
        seats = _StreamSeats(self.options.max_streams)
        server = grpc.server(
            futures.ThreadPoolExecutor(UNARY_THREADS, thread_name_prefix="grpc-unary"),
            interceptors=interceptors,
            options=self._channel_args(),
        )
        server.add_generic_rpc_handlers(
            (_handlers(self._servicer, asyncio.get_running_loop(), seats),)
        )
        address = f"{self.options.address}:{self.options.port}"
        if ":" in self.options.address and not self.options.address.startswith("["):
            address = f"[{self.options.address}]:{self.options.port}"
        try:
            if creds is None:
                self.port = server.add_insecure_port(address)
            else:
                self.port = server.add_secure_port(address, creds)
        except RuntimeError:  # "Failed to bind to address ...": the port is taken
            seats.shutdown()
            raise
        server.start()
        self._server = server
        self._seats = seats
        self._stopped = asyncio.Event()
        log.info(
            "serving Triton gRPC on %s:%d%s",
            self.options.address,
            self.port,
            " (TLS, client certificates required)"
            if self.options.use_ssl_mutual
            else " (TLS)"
            if creds is not None
            else "",
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
        if self._seats is not None:
            self._seats.shutdown()
        self._server = None
        self._stopped.set()

    async def wait(self) -> None:
        if self._server is not None:
            await self._stopped.wait()
