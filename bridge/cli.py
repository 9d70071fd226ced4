"""`dynamo-bridge` command line. Flags keep tritonserver's names where the meaning is the same.

The role (`--role all|worker|frontend`), discovery backend, request plane and namespace default to
Dynamo's own environment variables (docs/deployment.md); combinations that cannot work are
refused here, before anything starts.

Every other flag also has an environment form, as Dynamo's components have: `--grpc-port 9001`
is `DYN_BRIDGE_GRPC_PORT=9001` (the first long name, upper case, `-` as `_`). The command line
wins over the environment, the environment over the default. A repeatable flag takes a list:
paths separated by `os.pathsep` (`DYN_BRIDGE_MODEL_REPOSITORY=/a:/b`), other values by commas.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import uvloop

from model_repository_loader.config import ConfigOptions
from model_repository_loader.gpu import cuda
from model_repository_loader.gpu.devices import (
    MIN_COMPUTE_CAPABILITY,
    GpuDevice,
    supported_gpu_ids,
    visible_devices,
)
from model_repository_loader.isolation.environments import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    EnvironmentLimits,
)
from model_repository_loader.scheduling.rate_limiter import MODES as RATE_LIMIT_MODES
from model_repository_loader.scheduling.rate_limiter import ResourceLimit, parse_resource_limit

from .logs import (
    LOG_FORMATS,
    configure_dynamo_logging,
    configure_logging,
    dynamo_noise,
    filter_dynamo_noise,
    hide_filter_banner,
    redirect_output,
)
from .serialized_bytes import DEFAULT_MAX_DECODED_SIZE, DEFAULT_MAX_ELEMENTS, BytesLimits
from .tuning import request_plane_timeout, runtime_threads

if TYPE_CHECKING:
    from .frontends.triton import DoorOptions, HttpOptions
    from .frontends.triton.grpc.connections import ConnectionPolicy
    from .frontends.triton.header_forward import HeaderForwarding
    from .frontends.triton.http.connections import ConnectionLimits
    from .restrictions import Restriction

log = logging.getLogger("dynamo_bridge")

ROLES = ("all", "worker", "frontend")
DISCOVERY_BACKENDS = ("mem", "file", "etcd", "kubernetes")
REQUEST_PLANES = ("tcp", "nats")
DEFAULT_NAMESPACE = "dynamo_bridge"
ROLE_ENV = "DYN_BRIDGE_ROLE"
# tritonserver's gRPC message limit, both ways (src/common.h MAX_GRPC_MESSAGE_SIZE); no flag there.
MAX_GRPC_MESSAGE_SIZE = 2**31 - 1
METRICS_PORT = 8002  # tritonserver's; a worker's default is 0 (any free port)


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got '{text}'")
    return value


# The triton door's gRPC connections (frontends/triton/grpc/connections.py, whose
# ConnectionPolicy has each field): tritonserver's flags and defaults, milliseconds, and the
# bridge's idle limit.
GRPC_CONNECTION_FLAGS = (
    (
        "--grpc-keepalive-time",
        "keepalive_time_ms",
        int,
        "as tritonserver: ping a connection with calls in flight after this long without "
        "activity (default 7200000)",
    ),
    (
        "--grpc-keepalive-timeout",
        "keepalive_timeout_ms",
        int,
        "as tritonserver: close a connection whose ping is not answered within this "
        "(default 20000)",
    ),
    (
        "--grpc-keepalive-permit-without-calls",
        "keepalive_permit_without_calls",
        _bool,
        "as tritonserver: ping connections without calls too (default false)",
    ),
    (
        "--grpc-http2-max-pings-without-data",
        "http2_max_pings_without_data",
        int,
        "as tritonserver: at most this many pings while no data is sent (0: no limit; default 2)",
    ),
    (
        "--grpc-http2-min-recv-ping-interval-without-data",
        "http2_min_recv_ping_interval_without_data_ms",
        int,
        "as tritonserver: a client's ping sooner than this after the last one, with no data "
        "between, is a strike (default 300000)",
    ),
    (
        "--grpc-http2-max-ping-strikes",
        "http2_max_ping_strikes",
        int,
        "as tritonserver: strikes before the connection is sent GOAWAY and closed (0: no "
        "limit; default 2)",
    ),
    (
        "--grpc-max-connection-age",
        "max_connection_age_ms",
        int,
        "as tritonserver: close a connection this old once its calls end (default: none)",
    ),
    (
        "--grpc-max-connection-age-grace",
        "max_connection_age_grace_ms",
        int,
        "as tritonserver: how long calls may go on past --grpc-max-connection-age (default: none)",
    ),
    (
        "--grpc-max-connection-idle",
        "max_connection_idle_ms",
        int,
        "close a connection with no call in flight for this long (clients reconnect by "
        "themselves; 0: never; default 300000)",
    ),
)


def add_tls_flags(p: argparse.ArgumentParser, wire: str, what: str) -> None:
    """`--<wire>-use-ssl`, `--<wire>-use-ssl-mutual` and the three certificate paths, as
    tritonserver names them for gRPC; the triton door has them for both of its wires."""
    for flag, help_text in (
        (
            "use-ssl",
            f"triton door: serve {what} over TLS (needs --{wire}-server-cert and "
            f"--{wire}-server-key)",
        ),
        (
            "use-ssl-mutual",
            f"triton door: TLS that requires a client certificate signed by --{wire}-root-cert",
        ),
    ):
        p.add_argument(
            f"--{wire}-{flag}",
            type=_bool,
            nargs="?",
            const=True,
            default=False,
            metavar="BOOL",
            help=help_text,
        )
    for name in ("server-cert", "server-key", "root-cert"):
        p.add_argument(f"--{wire}-{name}", type=Path, default=None, metavar="PATH")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dynamo-bridge",
        description="Serve a Triton Python-backend model repository through NVIDIA Dynamo.",
    )
    p.add_argument(
        "--model-repository",
        "--model-store",
        dest="model_repositories",
        action="append",
        type=Path,
        default=[],
        metavar="PATH",
        help="model repository folder; repeat for several (required unless --role frontend)",
    )
    p.add_argument(
        "--role",
        default=None,
        metavar="{" + ",".join(ROLES) + "}",
        help="all (default): load the repository and serve gRPC in one process; worker: load "
        "the repository and register its models with Dynamo, no gRPC port; frontend: serve "
        f"gRPC for the models found through discovery, no repository (env {ROLE_ENV})",
    )
    p.add_argument(
        "--discovery-backend",
        default=None,
        metavar="{" + ",".join(DISCOVERY_BACKENDS) + "}",
        help="Dynamo discovery: mem (one process only), file (one host; DYN_FILE_KV), etcd "
        "(ETCD_ENDPOINTS) or kubernetes (default $DYN_DISCOVERY_BACKEND, else mem for --role "
        "all and file for worker and frontend)",
    )
    p.add_argument(
        "--request-plane",
        default=None,
        metavar="{" + ",".join(REQUEST_PLANES) + "}",
        help="Dynamo request plane: tcp or nats (NATS_SERVER) (default $DYN_REQUEST_PLANE, "
        "else tcp)",
    )
    p.add_argument(
        "--namespace",
        default=None,
        metavar="NAME",
        help="Dynamo namespace of every endpoint the bridge serves; a frontend only sees the "
        f"models of its namespace (default $DYN_NAMESPACE, else {DEFAULT_NAMESPACE})",
    )
    p.add_argument("--grpc-port", type=int, default=8001, help="KServe gRPC port (default 8001)")
    p.add_argument(
        "--host",
        "--grpc-address",
        dest="host",
        default="127.0.0.1",
        help="address to serve on (default 127.0.0.1); Dynamo 1.6's frontend binds every "
        "interface whatever this says, and the bridge warns at start-up",
    )
    p.add_argument(
        "--frontend",
        choices=("triton", "dynamo"),
        default="triton",
        help="the front door: triton (the bridge's own Triton server on Dynamo's runtime: "
        "Triton's gRPC and HTTP/REST APIs, its status codes and texts, TLS) or dynamo "
        "(Dynamo's KServe gRPC frontend, as Dynamo deployments run it; no HTTP/REST API); "
        "default $DYN_BRIDGE_FRONTEND, else triton",
    )
    add_tls_flags(p, "grpc", "gRPC")
    p.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="<protocols>:<key>=<value>",
        help="triton door, as tritonserver: the comma-separated protocol groups (health, "
        "metadata, inference, shared-memory, model-config, model-repository, statistics, trace, "
        "logging) answer only calls carrying the gRPC header '<key>: <value>'; repeatable",
    )
    for wire in ("grpc", "http"):
        p.add_argument(
            f"--{wire}-header-forward-pattern",
            default="",
            metavar="REGEX",
            help=f"triton door, as tritonserver: {wire.upper()} headers whose name matches "
            "(a case-insensitive search; '(?-i)' first for case-sensitive) reach the model as "
            "string request parameters",
        )
    p.add_argument(
        "--grpc-max-message-size",
        type=_positive_int,
        default=MAX_GRPC_MESSAGE_SIZE,
        metavar="BYTES",
        help="triton door: the largest gRPC message received or sent (default 2147483647, "
        "tritonserver's fixed INT32_MAX; it has no flag). A server may hold a few copies of "
        "each request in flight: lower this to bound what one client can make it allocate",
    )
    p.add_argument(
        "--max-bytes-elements",
        type=_positive_int,
        default=DEFAULT_MAX_ELEMENTS,
        metavar="N",
        help="the most BYTES (string) elements one inference request may carry over all its "
        f"inputs (default {DEFAULT_MAX_ELEMENTS}); more is refused INVALID_ARG before "
        "anything is decoded. tritonserver has no such limit; each element becomes a Python "
        "object for the model",
    )
    p.add_argument(
        "--max-bytes-decoded-size",
        type=_positive_int,
        default=DEFAULT_MAX_DECODED_SIZE,
        metavar="BYTES",
        help="the most memory one inference request's BYTES inputs may take once decoded into "
        f"Python objects (default {DEFAULT_MAX_DECODED_SIZE}: 8 bytes an element, plus "
        "33 + its length for elements of 2 bytes or more); more is refused INVALID_ARG before "
        "anything is decoded. tritonserver has no such limit",
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=8000,
        metavar="PORT",
        help="triton door: port of Triton's HTTP/REST API (default 8000; 0 picks a free one)",
    )
    add_tls_flags(p, "http", "HTTP (tritonserver has no such flags: the names follow gRPC's)")
    p.add_argument(
        "--http-address",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="triton door: address of the HTTP/REST API (default 127.0.0.1)",
    )
    # Every HTTP listener (the triton door's --http-port, --control-port, --metrics-port):
    # tritonserver has no such flags; the names and defaults are bridge/frontends/triton/http/
    # connections.py's, which says why (None here: its default, resolve_http_limits).
    p.add_argument(
        "--http-header-timeout-secs",
        type=float,
        default=None,
        metavar="SECONDS",
        help="every HTTP port: a request's line and headers must arrive within this long of "
        "its first byte (else 408 and the connection closes; default 5)",
    )
    p.add_argument(
        "--http-body-timeout-secs",
        type=float,
        default=None,
        metavar="SECONDS",
        help="every HTTP port: a request body may take this long after its headers, plus one "
        "second per --http-min-body-rate bytes received, and pause no longer than this (else "
        "408 and the connection closes; default 10)",
    )
    p.add_argument(
        "--http-min-body-rate",
        type=int,
        default=None,
        metavar="BYTES_PER_SECOND",
        help="every HTTP port: the slowest a request body may arrive on average, past "
        "--http-body-timeout-secs (default 4096; 0: the whole body within that timeout)",
    )
    p.add_argument(
        "--http-max-header-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="every HTTP port: the largest request line and headers, together (else 431 and "
        "the connection closes; default 65536)",
    )
    p.add_argument(
        "--http-keep-alive-timeout-secs",
        type=float,
        default=None,
        metavar="SECONDS",
        help="every HTTP port: close a connection idle this long between requests (default 75)",
    )
    p.add_argument(
        "--http-max-connections",
        type=int,
        default=None,
        metavar="N",
        help="every HTTP port: at most N open connections each; at the cap the connection "
        "idle longest makes room, else the request waited on longest (408), else the new one "
        "is answered 503 and closed (default 1024)",
    )
    p.add_argument(
        "--http-max-connections-per-client",
        type=int,
        default=None,
        metavar="N",
        help="every HTTP port: at most N open connections from one client (an IPv4 address or "
        "an IPv6 /64); at the cap its connection idle longest makes room, else its request "
        "waited on longest (408), else its new one is answered 503 and closed (default 256)",
    )
    p.add_argument(
        "--grpc-max-connections",
        type=int,
        default=None,
        metavar="N",
        help="triton door: at most N open gRPC connections; more are closed (default: what "
        "the open-file limit leaves after the HTTP ports' caps; Dynamo's frontend has no "
        "such limit)",
    )
    p.add_argument(
        "--grpc-thread-cpu",
        default=None,
        metavar="auto|off|CPU",
        help="triton door: the CPU the gRPC server's threads run on, which all hold Python's "
        "GIL (one CPU spares them handing it across CPUs); auto: the last CPU this process may "
        "use, when it may use several (default auto)",
    )
    p.add_argument(
        "--grpc-max-streams",
        type=int,
        default=None,
        metavar="N",
        help="triton door: at most N ModelStreamInfer calls open at once, each holding two "
        "threads; more are refused with RESOURCE_EXHAUSTED (default 1024)",
    )
    p.add_argument(
        "--grpc-stream-requests",
        type=int,
        default=None,
        metavar="N",
        help="triton door: at most N requests of one ModelStreamInfer call in flight at once; "
        "past them (and 32 read ahead) the client's sends wait (gRPC's flow control), and a "
        "client that writes more than that before reading any answer waits for itself "
        "(default 1024)",
    )
    p.add_argument(
        "--grpc-infer-threads",
        type=int,
        default=None,
        metavar="N",
        help="triton door: ModelInfer calls answered at once, each on a thread that waits for "
        "its model; N more wait for a thread, and past every thread and those the server "
        "refuses a call with RESOURCE_EXHAUSTED (default 1024)",
    )
    for flag, field, convert, help_text in GRPC_CONNECTION_FLAGS:
        p.add_argument(
            flag,
            dest=f"grpc_{field}",
            type=convert,
            default=None,
            metavar="BOOL" if convert is _bool else "MS",
            help=f"triton door: {help_text}",
        )
    p.add_argument(
        "--http-allowed-hosts",
        default=None,
        metavar="HOST[:PORT],...",
        help="triton door: the Host names its HTTP port answers to, against DNS rebinding "
        "(comma list; no port: any; '*': any name). Loopback names always; default: only "
        "those on a loopback --http-address, any elsewhere. A web page may POST only from its "
        "own origin on one of these names",
    )
    p.add_argument(
        "--http-max-input-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="as tritonserver: the largest HTTP request JSON, decompressed body and JSON input, "
        "and here also the largest request body (default 67108864, 64 MB)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="port of /metrics (Triton's nv_inference_*, custom metrics and, with --frontend "
        "dynamo, Dynamo's frontend metrics) and of /v2/health/ready and /v2/health/live "
        f"(default {METRICS_PORT}; for --role worker any free port, announced in the log, so "
        "that several workers share a host)",
    )
    p.add_argument(
        "--exit-on-lease-loss",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="with etcd discovery, when Dynamo drops this process's lease (etcd away past "
        "ETCD_LEASE_TTL): exit with status 1 for a supervisor to restart it, instead of the "
        "default, which starts this process again by itself (re-executed) once etcd answers",
    )
    p.add_argument(
        "--allow-metrics",
        type=_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="serve the metrics port (default true)",
    )
    p.add_argument(
        "--allow-gpu-metrics",
        type=_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="serve Triton's GPU metrics (nv_gpu_*, nv_energy_consumption) of the GPUs this "
        "process's models may use, read from NVML (default true; none on a host without GPUs)",
    )
    p.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address of the metrics port (default 127.0.0.1)",
    )
    p.add_argument(
        "--metrics-config",
        dest="metrics_config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="as tritonserver: summary_latencies=true (quantile summaries), "
        "summary_quantiles=Q:E,..., counter_latencies=false, histogram_latencies=true "
        "(decoupled models' first-response histogram); repeat for several",
    )
    p.add_argument(
        "--cache-config",
        dest="cache_config",
        action="append",
        default=[],
        metavar="<cache>,<key>=<value>",
        help="as tritonserver: local,size=BYTES serves models whose config has "
        "response_cache { enable: true } from a response cache of that size (least recently "
        "used entries evicted); one cache per worker process",
    )
    p.add_argument(
        "--response-cache-byte-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="deprecated in tritonserver: the same as --cache-config local,size=BYTES",
    )
    p.add_argument(
        "--cache-directory",
        default="",
        metavar="PATH",
        help="accepted for tritonserver's command lines; the local cache is built in",
    )
    p.add_argument(
        "--trace-config",
        dest="trace_config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="as tritonserver: level=OFF|TIMESTAMPS|TENSORS, rate=N, count=N, "
        "mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, "
        "opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE; repeat for several "
        "(with --frontend triton)",
    )
    p.add_argument(
        "--strict-model-config",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="require a complete config.pbtxt; disables auto-complete",
    )
    p.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="do not call auto_complete_config; a config.pbtxt is required",
    )
    p.add_argument("--model-config-name", default="", help="use <model>/configs/<name>.pbtxt")
    p.add_argument(
        "--instance-kind",
        choices=("auto", "thread", "process"),
        default="auto",
        help="where model instances run unless a config sets BRIDGE_INSTANCE_KIND: auto (a "
        "process per instance when a group has count > 1, else a thread), thread or process",
    )
    p.add_argument(
        "--environment-max-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_BYTES,
        metavar="BYTES",
        help="the most an EXECUTION_ENV_PATH archive may unpack to, in its files' bytes "
        f"(default {DEFAULT_MAX_BYTES}, 16 GiB); a larger one fails that model's load. "
        "tritonserver has no such limit",
    )
    p.add_argument(
        "--environment-max-files",
        type=_positive_int,
        default=DEFAULT_MAX_FILES,
        metavar="N",
        help="the most members (files, folders, links) an EXECUTION_ENV_PATH archive may "
        f"unpack (default {DEFAULT_MAX_FILES}); more fails that model's load",
    )
    p.add_argument(
        "--environment-cache-max-bytes",
        type=_positive_int,
        default=DEFAULT_CACHE_BYTES,
        metavar="BYTES",
        help="past this, the unpacked environments in the cache that no loaded model uses are "
        f"removed, least recently used first (default {DEFAULT_CACHE_BYTES}, 64 GiB)",
    )
    p.add_argument(
        "--min-supported-compute-capability",
        type=float,
        default=MIN_COMPUTE_CAPABILITY,
        metavar="VERSION",
        help="as tritonserver: GPUs below this CUDA compute capability are not used "
        f"(default {MIN_COMPUTE_CAPABILITY})",
    )
    p.add_argument(
        "--rate-limit",
        type=str.lower,
        choices=RATE_LIMIT_MODES,
        default="off",
        help="as tritonserver: execution_count runs an instance only while the resources its "
        "instance group's rate_limiter asks for are free, waiting instances taken by execution "
        "count times priority; off (the default) ignores every rate_limiter",
    )
    p.add_argument(
        "--rate-limit-resource",
        dest="rate_limit_resources",
        type=_resource_limit,
        action="append",
        default=[],
        metavar="NAME:COUNT[:DEVICE]",
        help="as tritonserver: the count of a rate limiter resource (on DEVICE, else on every "
        "device; global resources take the largest given); once one is given, a resource not "
        "given has none. Default: the largest count any instance asks for. Repeatable",
    )
    p.add_argument(
        "--exit-on-error",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="exit at start-up if any model fails to load (tritonserver's default; ours is false)",
    )
    p.add_argument(
        "--allow-client-shm",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="let clients register system and CUDA shared memory regions for their tensors "
        "(default false, as tritonserver 2.70 on; status requests answer either way)",
    )
    p.add_argument(
        "--max-shm-regions",
        type=_positive_int,
        default=None,
        metavar="N",
        help="the most shared memory regions (system and CUDA together) clients may have "
        "registered at once (default 1024); past it a registration is refused UNAVAILABLE "
        "until one is unregistered. tritonserver has no such limit",
    )
    p.add_argument(
        "--strict-readiness",
        type=_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="server readiness needs every model ready: loaded, its instances alive and its "
        "own is_ready() true (default true, as tritonserver); false: only the server's own",
    )
    p.add_argument(
        "--model-control-mode",
        choices=("poll", "none", "explicit"),
        default="poll",
        help="poll (default): watch the repositories and reload changed models with no gap; "
        "none: load once; explicit: load only --load-model, then load/unload through "
        "--control-port or pb_utils.load_model",
    )
    p.add_argument(
        "--load-model",
        dest="load_models",
        action="append",
        default=[],
        metavar="NAME",
        help="explicit mode: a model to load at start-up; repeat for several, '*' for all",
    )
    p.add_argument(
        "--control-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Triton's HTTP model repository API (index, load, unload) and health on "
        "127.0.0.1:PORT, in any role and with either --frontend, for the workers of the "
        "namespace; load/unload are accepted in explicit mode only",
    )
    p.add_argument(
        "--http-restricted-api",
        dest="http_restricted_api",
        action="append",
        default=[],
        metavar="<apis>:<key>=<value>",
        help="as tritonserver: the comma-separated API groups answer only requests carrying the "
        "header '<key>: <value>' (403 otherwise); repeat for several groups. Honoured by the "
        "triton door's HTTP port (--http-port) and by --control-port (its 'model-repository' "
        "and 'health' groups)",
    )
    p.add_argument(
        "--reload-debounce-secs",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="poll mode: wait until the repository has been quiet this long before reloading "
        "(default 0.5)",
    )
    p.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="at shutdown, wait at most this long for in-flight requests and finalize(), then "
        "exit anyway (status 1); a second SIGINT/SIGTERM exits at once (default 30)",
    )
    p.add_argument(
        "--log-verbose",
        type=int,
        default=0,
        metavar="LEVEL",
        help="1 or more shows verbose (debug) lines, pb_utils.Logger.log_verbose included, and "
        "Dynamo's per-request lines",
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="default",
        help="time stamps as tritonserver writes them: default (I1121 09:23:01.443324) or "
        "ISO8601 (2026-11-21T09:23:01Z I)",
    )
    p.add_argument(
        "--log-file",
        default="",
        metavar="PATH",
        help="append all output (the bridge's, Dynamo's, the model instances') to PATH "
        "instead of the console",
    )
    return p


@dataclass(frozen=True, slots=True)
class Topology:
    """Where this process sits in a deployment: its role and how it reaches the others."""

    role: str
    discovery_backend: str
    request_plane: str
    namespace: str


def _choice(
    parser: argparse.ArgumentParser,
    flag: str,
    given: str | None,
    env: str,
    default: str,
    choices: Sequence[str],
    environ: Mapping[str, str],
) -> str:
    """The flag's value, else the environment's, else `default`; refused unless in `choices`."""
    if given is not None:
        value, source = given, flag
    elif environ.get(env):
        value, source = environ[env], f"{env} (for {flag})"
    else:
        value, source = default, flag
    value = value.strip().lower()
    if value not in choices:
        parser.error(f"{source}: invalid choice '{value}' (choose from {', '.join(choices)})")
    return value


def resolve_topology(
    parser: argparse.ArgumentParser, args: argparse.Namespace, environ: Mapping[str, str]
) -> Topology:
    """Role, discovery, request plane and namespace from flags and Dynamo's environment
    variables; exits through `parser.error` (status 2) on a combination that cannot work."""
    role = _choice(parser, "--role", args.role, ROLE_ENV, "all", ROLES, environ)
    split = role != "all"
    discovery = _choice(
        parser,
        "--discovery-backend",
        args.discovery_backend,
        "DYN_DISCOVERY_BACKEND",
        "file" if split else "mem",
        DISCOVERY_BACKENDS,
        environ,
    )
    plane = _choice(
        parser,
        "--request-plane",
        args.request_plane,
        "DYN_REQUEST_PLANE",
        "tcp",
        REQUEST_PLANES,
        environ,
    )
    namespace = args.namespace if args.namespace is not None else environ.get("DYN_NAMESPACE")
    namespace = (namespace or DEFAULT_NAMESPACE).strip()
    if not re.fullmatch(r"[a-z0-9_-]+", namespace):
        # Dynamo refuses other names in an endpoint path, and only after start-up.
        parser.error(f"--namespace: '{namespace}' must use only a-z, 0-9, '_' and '-'")
    if split and discovery == "mem":
        parser.error(
            f"--role {role} needs a discovery backend shared between processes: mem discovery "
            "lives inside one process (use --discovery-backend file, etcd or kubernetes)"
        )
    if role == "frontend" and args.model_repositories:
        parser.error(
            "--role frontend serves the models it finds through discovery and takes no "
            "--model-repository (start a --role worker for the repository)"
        )
    if role != "frontend" and not args.model_repositories:
        parser.error(
            "the following arguments are required: --model-repository"
            + (" (--role worker serves the models of a repository)" if role == "worker" else "")
        )
    return Topology(role, discovery, plane, namespace)


ENV_PREFIX = "DYN_BRIDGE_"
# Flags whose environment form is Dynamo's own variable (resolve_topology reads them).
_TOPOLOGY_DESTS = frozenset({"role", "discovery_backend", "request_plane", "namespace"})


def env_name(action: argparse.Action) -> str:
    """`--grpc-port` → `DYN_BRIDGE_GRPC_PORT`."""
    flag = next(o for o in action.option_strings if o.startswith("--"))
    return ENV_PREFIX + flag[2:].upper().replace("-", "_")


def parse_with_environment(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, environ: Mapping[str, str]
) -> argparse.Namespace:
    """Parse `argv`; a flag not given there takes its `DYN_BRIDGE_*` variable, if set
    (parser.error when that is invalid)."""
    from_env: dict[str, object] = {}
    for action in parser._actions:
        if not action.option_strings or action.dest in _TOPOLOGY_DESTS or action.dest == "help":
            continue
        name = env_name(action)
        text = environ.get(name)
        if text is None or text == "":
            continue
        try:
            from_env[action.dest] = _env_value(action, text)
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            parser.error(f"{name}: invalid value '{text}': {exc}")
    # A repeatable flag given on the command line replaces its variable rather than extending
    # it, so lists are filled in after parsing, and only where the command line gave none.
    lists = {dest: value for dest, value in from_env.items() if isinstance(value, list)}
    parser.set_defaults(**{d: v for d, v in from_env.items() if d not in lists})
    args = parser.parse_args(argv)
    for dest, values in lists.items():
        if not getattr(args, dest):
            setattr(args, dest, values)
    return args


def _resource_limit(text: str) -> ResourceLimit:
    try:
        return parse_resource_limit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _env_value(action: argparse.Action, text: str) -> object:
    if isinstance(action, argparse._StoreTrueAction):
        return _bool(text)
    convert = action.type if callable(action.type) else str
    if isinstance(action, argparse._AppendAction):
        separator = os.pathsep if convert is Path else ","
        if action.dest == "trace_config":  # `triton,file=x` holds the separator itself
            from .tracing.config import join_mode_parts

            return join_mode_parts([p.strip() for p in text.split(",") if p.strip()])
        return [convert(part.strip()) for part in text.split(separator) if part.strip()]
    value = convert(text)
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"choose from {', '.join(map(str, action.choices))}")
    return value


def found_gpus() -> tuple[GpuDevice, ...]:
    """The GPUs this process's models may use, each named once in the log."""
    devices = tuple(visible_devices())
    for device in devices:
        if not device.readable:
            continue  # warned as found
        log.info(
            "GPU %d: %s, compute capability %.1f (%s)",
            device.index,
            device.name,
            device.compute_capability,
            device.uuid,
        )
    if devices:
        try:  # counts the devices: loads the driver, makes no context
            cuda.require_device()
            log.info("CUDA calls through %s", cuda.calls().name)
        except (cuda.CudaUnavailable, cuda.CudaError) as exc:
            log.warning(
                "GPUs found, but CUDA cannot be used (%s): models run, and GPU tensors in "
                "pb_utils fail (docs/gpu.md)",
                exc,
            )
    return devices


def parse_cache_config(settings: Sequence[str], byte_size: int | None) -> int:
    """The response cache's size in bytes from `--cache-config` / `--response-cache-byte-size`
    (0: no cache). Raises ValueError naming what cannot be served."""
    size = byte_size or 0
    if byte_size is not None:
        log.warning(
            "'--response-cache-byte-size' has been deprecated; the equivalent is "
            "'--cache-config=local,size=%d'",
            byte_size,
        )
    for setting in settings:
        cache, _, pair = setting.partition(",")
        key, sep, value = pair.partition("=")
        if cache.strip() != "local":
            raise ValueError(
                f"--cache-config {setting}: only the 'local' cache is available (an in-process "
                "cache; Triton's 'redis' and custom caches are shared libraries)"
            )
        if not sep or key.strip() != "size":
            raise ValueError(f"--cache-config {setting}: the local cache takes size=<bytes>")
        try:
            size = int(value)
        except ValueError:
            size = -1
        if size < 0:
            raise ValueError(f"--cache-config {setting}: size must be a number of bytes >= 0")
    return size


def resolve_door(
    parser: argparse.ArgumentParser, args: argparse.Namespace, namespace: str = DEFAULT_NAMESPACE
) -> DoorOptions | None:
    """The triton door's options (`--frontend triton`), whole: its port, address and the
    namespace it serves too; None for Dynamo's frontend. Exits through `parser.error`
    (status 2) on flags that need the triton door or do not parse."""
    if args.frontend == "dynamo":
        if args.grpc_use_ssl or args.grpc_use_ssl_mutual or args.grpc_restricted_protocol:
            parser.error(
                "--grpc-use-ssl, --grpc-use-ssl-mutual and --grpc-restricted-protocol need "
                "--frontend triton"
            )
        given = [
            flag
            for flag, dest in (
                ("--grpc-max-connections", "grpc_max_connections"),
                ("--grpc-max-streams", "grpc_max_streams"),
                ("--grpc-stream-requests", "grpc_stream_requests"),
                ("--grpc-infer-threads", "grpc_infer_threads"),
                ("--grpc-thread-cpu", "grpc_thread_cpu"),
                *((flag, f"grpc_{field}") for flag, field, _, _ in GRPC_CONNECTION_FLAGS),
            )
            if getattr(args, dest) is not None
        ]
        if given:
            parser.error(f"{', '.join(given)}: need --frontend triton")
        if args.grpc_max_message_size != MAX_GRPC_MESSAGE_SIZE:
            parser.error("--grpc-max-message-size needs --frontend triton")
        if args.grpc_header_forward_pattern or args.http_header_forward_pattern:
            parser.error(
                "--grpc-header-forward-pattern and --http-header-forward-pattern need "
                "--frontend triton"
            )
        return None
    from .frontends.triton import DoorOptions
    from .frontends.triton.grpc.methods import INFER_THREADS, MAX_STREAMS
    from .frontends.triton.grpc.restrictions import parse_restricted_protocol
    from .frontends.triton.grpc.servicer import STREAM_REQUESTS
    from .tuning import grpc_thread_cpu

    try:
        restricted = parse_restricted_protocol(args.grpc_restricted_protocol)
    except ValueError as exc:
        parser.error(str(exc))
    connections = args.grpc_max_connections
    if connections is not None and connections < 1:
        parser.error(f"--grpc-max-connections: {connections} is not >= 1")
    streams = args.grpc_max_streams if args.grpc_max_streams is not None else MAX_STREAMS
    if streams < 1:
        parser.error(f"--grpc-max-streams: {streams} is not >= 1")
    stream_requests = args.grpc_stream_requests
    if stream_requests is None:
        stream_requests = STREAM_REQUESTS
    if stream_requests < 1:
        parser.error(f"--grpc-stream-requests: {stream_requests} is not >= 1")
    infer_threads = (
        args.grpc_infer_threads if args.grpc_infer_threads is not None else INFER_THREADS
    )
    if infer_threads < 1:
        parser.error(f"--grpc-infer-threads: {infer_threads} is not >= 1")
    try:
        thread_cpu = grpc_thread_cpu(args.grpc_thread_cpu or "auto")
    except ValueError as exc:
        parser.error(f"--grpc-thread-cpu: {exc}")
    return DoorOptions(
        port=args.grpc_port,
        address=args.host,
        namespace=namespace,
        max_message_size=args.grpc_max_message_size,
        restricted=restricted,
        max_connections=connections,
        max_streams=streams,
        stream_requests=stream_requests,
        infer_threads=infer_threads,
        thread_cpu=thread_cpu,
        connection_policy=_grpc_connection_policy(parser, args),
        header_forwarding=_forwarding(parser, "grpc", args.grpc_header_forward_pattern),
        use_ssl=args.grpc_use_ssl,
        use_ssl_mutual=args.grpc_use_ssl_mutual,
        server_cert=args.grpc_server_cert,
        server_key=args.grpc_server_key,
        root_cert=args.grpc_root_cert,
    )


def _grpc_connection_policy(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> ConnectionPolicy:
    """The triton door's gRPC connection settings; parser.error on one that cannot work."""
    from .frontends.triton.grpc.connections import ConnectionPolicy

    given = {field: getattr(args, f"grpc_{field}") for _, field, _, _ in GRPC_CONNECTION_FLAGS}
    policy = ConnectionPolicy(**{k: v for k, v in given.items() if v is not None})
    try:
        policy.check()
    except ValueError as exc:
        parser.error(str(exc))
    return policy


def resolve_http_limits(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> ConnectionLimits:
    """Every HTTP listener's deadlines and connection cap; parser.error on a value that cannot
    work."""
    from .frontends.triton.http.connections import ConnectionLimits

    given = {
        "header_timeout": args.http_header_timeout_secs,
        "body_timeout": args.http_body_timeout_secs,
        "keep_alive_timeout": args.http_keep_alive_timeout_secs,
        "max_connections": args.http_max_connections,
        "max_connections_per_client": args.http_max_connections_per_client,
        "min_body_rate": args.http_min_body_rate,
        "max_header_size": args.http_max_header_size,
    }
    limits = ConnectionLimits(**{k: v for k, v in given.items() if v is not None})
    try:
        limits.check()
    except ValueError as exc:
        parser.error(str(exc))
    return limits


def resolve_max_shm_regions(args: argparse.Namespace) -> int:
    """`--max-shm-regions`, or the door's default (shm.py, imported only once parsed)."""
    from .frontends.triton.shm import DEFAULT_MAX_REGIONS

    regions: int | None = args.max_shm_regions
    return DEFAULT_MAX_REGIONS if regions is None else regions


def resolve_max_input_size(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`--http-max-input-size`: the triton door's HTTP port and the control port, whatever the
    front door; parser.error unless positive."""
    from .frontends.triton.http.limits import DEFAULT_MAX_INPUT_SIZE

    size: int = args.http_max_input_size
    if size is None:
        size = DEFAULT_MAX_INPUT_SIZE
    if size <= 0:
        parser.error("--http-max-input-size must be a positive number of bytes")
    return size


def resolve_http(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    restricted: dict[str, Restriction],
    limits: ConnectionLimits,
    max_input_size: int,
) -> HttpOptions | None:
    """The triton door's HTTP options (`--frontend triton`), None for Dynamo's frontend, which
    has no HTTP/REST API (its port and address flags are then unused; TLS is refused)."""
    if args.frontend == "dynamo":
        if args.http_use_ssl or args.http_use_ssl_mutual:
            parser.error("--http-use-ssl and --http-use-ssl-mutual need --frontend triton")
        return None
    from .frontends.triton import HttpOptions
    from .frontends.triton.http.security import parse_allowed_hosts

    try:
        allowed_hosts = parse_allowed_hosts(args.http_allowed_hosts)
    except ValueError as exc:
        parser.error(str(exc))
    return HttpOptions(
        port=args.http_port,
        address=args.http_address,
        restricted=restricted,
        allowed_hosts=allowed_hosts,
        max_input_size=max_input_size,
        use_ssl=args.http_use_ssl,
        use_ssl_mutual=args.http_use_ssl_mutual,
        server_cert=args.http_server_cert,
        server_key=args.http_server_key,
        root_cert=args.http_root_cert,
        limits=limits,
        header_forwarding=_forwarding(parser, "http", args.http_header_forward_pattern),
    )


def _forwarding(
    parser: argparse.ArgumentParser, wire: str, pattern: str
) -> HeaderForwarding | None:
    """`--<wire>-header-forward-pattern` compiled; parser.error for one that does not parse."""
    if not pattern:
        return None
    from .frontends.triton.header_forward import HeaderForwarding

    try:
        return HeaderForwarding(pattern)
    except ValueError as exc:
        parser.error(f"--{wire}-header-forward-pattern: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_with_environment(parser, argv, os.environ)
    topology = resolve_topology(parser, args, os.environ)
    sys.argv[:] = [""]  # parsed; models now see what Triton's stub gives them, not our flags
    if args.log_file:
        try:
            redirect_output(args.log_file)
        except OSError as exc:
            parser.error(f"--log-file: cannot open '{args.log_file}': {exc.strerror}")
    if args.log_verbose <= 0:
        filter_dynamo_noise()  # before Dynamo is imported and writes its first line
    configure_logging(args.log_verbose, args.log_format)
    # Before Dynamo's runtime starts: it reads its logging settings once, and its thread counts.
    quiet_targets = configure_dynamo_logging(args.log_verbose, os.environ)
    runtime_threads(os.environ, topology.request_plane)
    request_plane_timeout(os.environ)
    with hide_filter_banner(quiet_targets):  # Dynamo reads DYN_LOG when first imported
        from .metrics.triton import parse_metrics_config
        from .options import Timings
        from .restrictions import parse_restricted_api
        from .server import RuntimeSettingsError, ServerOptions, StartupError, serve
        from .tracing.config import parse_trace_config

    try:
        timings = Timings.from_environment(os.environ)
        restricted = parse_restricted_api(args.http_restricted_api)
        metrics_config = parse_metrics_config(args.metrics_config)
        cache_bytes = parse_cache_config(args.cache_config, args.response_cache_byte_size)
        trace_config = parse_trace_config(args.trace_config)
    except ValueError as exc:
        parser.error(str(exc))
    if args.frontend == "dynamo":
        if args.trace_config:
            log.warning("--trace-config has no effect without --frontend triton")
        if restricted and args.control_port is None:
            log.warning(
                "--http-restricted-api has no effect without --control-port or --frontend triton"
            )
        if others := sorted(set(restricted) - {"model-repository", "health"}):
            log.warning(
                "--http-restricted-api: %s not served over HTTP without --frontend triton",
                ", ".join(others),
            )
    door = resolve_door(parser, args, topology.namespace)
    gpus = found_gpus() if topology.role != "frontend" else ()
    http_limits = resolve_http_limits(parser, args)
    max_input_size = resolve_max_input_size(parser, args)
    options = ServerOptions(
        model_repositories=args.model_repositories,
        role=topology.role,
        discovery_backend=topology.discovery_backend,
        request_plane=topology.request_plane,
        namespace=topology.namespace,
        grpc_port=args.grpc_port,
        metrics_port=(
            args.metrics_port
            if args.metrics_port is not None
            else (0 if topology.role == "worker" else METRICS_PORT)
        ),
        allow_metrics=args.allow_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        gpus=gpus,
        exit_on_lease_loss=args.exit_on_lease_loss,
        metrics_address=args.metrics_address,
        metrics_config=metrics_config,
        response_cache_bytes=cache_bytes,
        trace=trace_config,
        host=args.host,
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        allow_client_shm=args.allow_client_shm,
        max_shm_regions=resolve_max_shm_regions(args),
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_models),
        control_port=args.control_port,
        reload_debounce=args.reload_debounce_secs,
        http_restricted_api=restricted,
        exit_timeout=args.exit_timeout_secs,
        timings=timings,
        bytes_limits=BytesLimits(args.max_bytes_elements, args.max_bytes_decoded_size),
        rate_limit=args.rate_limit,
        rate_limit_resources=tuple(args.rate_limit_resources),
        door=door,
        http=resolve_http(parser, args, restricted, http_limits, max_input_size),
        http_limits=http_limits,
        http_max_input_size=max_input_size,
        loader=ConfigOptions(
            auto_complete=not (args.strict_model_config or args.disable_auto_complete_config),
            model_config_name=args.model_config_name,
            instance_kind=args.instance_kind,
            environment_limits=EnvironmentLimits(
                args.environment_max_bytes,
                args.environment_max_files,
                args.environment_cache_max_bytes,
            ),
            gpu_ids=supported_gpu_ids(gpus, args.min_supported_compute_capability),
            min_compute_capability=args.min_supported_compute_capability,
        ),
    )
    try:
        uvloop.run(serve(options))
    except StartupError as exc:
        print(f"error: creating server: Internal - {exc}", file=sys.stderr)
        return 1
    except RuntimeSettingsError as exc:
        log.error("%s", exc)
        return 1
    finally:
        dynamo_noise.close()  # Dynamo's last lines still in the filter's pipe
    return 0
