"""LAB ONLY: one synchronous gRPC port for unary calls and streams, threads bounded (issue 37).

Issue 37's first item moves the door's unary ModelInfer onto a synchronous `grpc.server`
(`benchmarks/door_sync.py` measured what that wins). A synchronous server runs each RPC on a
pool thread, and a stream holds its thread for as long as it is open: idle streams in the one
pool would take every thread from the unary calls. gRPC Python (1.85) lets a method handler
carry a pool of its own (`experimental_thread_pool` on the handler's function): this measures
that mechanism, which is how one port would serve both.

The server (this process, `--serve`): `ModelInfer` of `add_sub` (benchmarks/grpc_floor.py's
bare answer) on the server's pool of `--unary-threads`; `ModelStreamInfer` answering each
request the same way, on its own pool of `--stream-threads` (`--shared`: on the server's pool,
as a plain synchronous server has it). The client (a second process, so that the server's GIL
is its own): opens `--idle-streams` streams that send nothing, then `--clients` threads call
ModelInfer for `--seconds`, each waiting at most 2 s per call. Prints a table: answered calls
per second, calls that got no answer, p50, and the server's threads and RSS.

    python -m benchmarks.stream_pool --idle-streams 0,1000 --clients 8
    python -m benchmarks.stream_pool --idle-streams 8 --shared
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from benchmarks.grpc_floor import _answer

SERVICE = "inference.GRPCInferenceService"


def _add_sub_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 4])  # data: raw contents
        request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    return request


def serve(port: int, unary_threads: int, stream_threads: int, shared: bool) -> None:
    def infer(request: Any, context: Any) -> pb.ModelInferResponse:
        return _answer(request)

    def stream_infer(requests: Iterator[Any], context: Any) -> Iterator[Any]:
        for request in requests:
            yield pb.ModelStreamInferResponse(infer_response=_answer(request))

    if not shared:  # the stream's own pool: gRPC runs this method's RPCs there
        stream_infer.experimental_thread_pool = futures.ThreadPoolExecutor(  # type: ignore[attr-defined]
            max_workers=stream_threads, thread_name_prefix="stream"
        )
    methods = {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            infer, pb.ModelInferRequest.FromString, pb.ModelInferResponse.SerializeToString
        ),
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            stream_infer,
            pb.ModelInferRequest.FromString,
            pb.ModelStreamInferResponse.SerializeToString,
        ),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=unary_threads))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("serving", flush=True)
    sys.stdin.read()  # until the client closes our stdin
    server.stop(0)


def _server_usage(pid: int) -> tuple[int, int]:
    """The server's threads and RSS (MiB)."""
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) // 1024


def measure(port: int, pid: int, idle: int, clients: int, seconds: float) -> dict[str, Any]:
    channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for _ in range(max(1, idle // 100))]
    stop = threading.Event()

    def nothing() -> Iterator[pb.ModelInferRequest]:
        stop.wait()
        return
        yield  # a generator that sends nothing until the end

    streams = []
    for index in range(idle):
        call = channels[index % len(channels)].stream_stream(
            f"/{SERVICE}/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )(nothing())
        streams.append(call)
    time.sleep(2.0 + idle / 500)  # every stream reached the server
    infer = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary(
        f"/{SERVICE}/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    request = _add_sub_request()
    latencies: list[float] = []
    unanswered = [0]
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < end:
            start = time.monotonic()
            try:
                infer(request, timeout=2.0)
            except grpc.RpcError:
                with lock:
                    unanswered[0] += 1
                continue
            with lock:
                latencies.append(time.monotonic() - start)

    workers = [threading.Thread(target=client) for _ in range(clients)]
    for worker in workers:
        worker.start()
    time.sleep(seconds / 2)
    threads, rss = _server_usage(pid)
    for worker in workers:
        worker.join()
    stop.set()
    for call in streams:
        call.cancel()
    return {
        "idle": idle,
        "per_s": len(latencies) / seconds,
        "unanswered": unanswered[0],
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "threads": threads,
        "rss": rss,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-streams", default="0,1000")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--unary-threads", type=int, default=8)
    parser.add_argument("--stream-threads", type=int, default=2048)
    parser.add_argument("--shared", action="store_true")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server's port
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.unary_threads, args.stream_threads, args.shared)
        return 0
    from tests.harness.ports import free_ports

    print("| idle streams | calls/s | unanswered (2 s) | p50 ms | server threads | RSS MiB |")
    print("|---:|---:|---:|---:|---:|---:|")
    for idle in [int(n) for n in args.idle_streams.split(",")]:
        (port,) = free_ports(1)
        argv_server = [sys.executable, "-m", "benchmarks.stream_pool", "--serve", str(port)]
        argv_server += ["--unary-threads", str(args.unary_threads)]
        argv_server += ["--stream-threads", str(args.stream_threads)]
        argv_server += ["--shared"] if args.shared else []
        server = subprocess.Popen(
            argv_server, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ
        )
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "serving"
            row = measure(port, server.pid, idle, args.clients, args.seconds)
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(30)
        print(
            f"| {row['idle']} | {row['per_s']:.0f} | {row['unanswered']} | {row['p50_ms']:.2f} "
            f"| {row['threads']} | {row['rss']} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
