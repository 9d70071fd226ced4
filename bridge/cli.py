"""`dynamo-bridge` command line. Flags keep tritonserver's names where the meaning is the same."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import uvloop

from model_repository_loader.config import ConfigOptions

from .logs import configure_logging


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


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
        required=True,
        metavar="PATH",
        help="model repository folder; repeat for several",
    )
    p.add_argument("--grpc-port", type=int, default=8001, help="KServe gRPC port (default 8001)")
    p.add_argument(
        "--host",
        "--grpc-address",
        dest="host",
        default="127.0.0.1",
        help="address to serve on (default 127.0.0.1)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=8002,
        help="port of the Dynamo frontend's /metrics and /health (default 8002)",
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
        "--exit-on-error",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="exit at start-up if any model fails to load (tritonserver's default; ours is false)",
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
        help="serve Triton's HTTP model repository API (index, load, unload) on "
        "127.0.0.1:PORT; load/unload are accepted in explicit mode only",
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
        help="1 or more shows verbose (debug) lines, pb_utils.Logger.log_verbose included",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_verbose)
    # Dynamo reads DYN_LOG when it is first imported; its INFO level logs ~5 lines per request.
    os.environ.setdefault("DYN_LOG", "warn")
    # A failed request is a normal outcome here, not a crash: no Rust backtrace for each one.
    os.environ.setdefault("RUST_LIB_BACKTRACE", "0")
    from .server import ServerOptions, StartupError, serve

    options = ServerOptions(
        model_repositories=args.model_repositories,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        host=args.host,
        exit_on_error=args.exit_on_error,
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_models),
        control_port=args.control_port,
        reload_debounce=args.reload_debounce_secs,
        exit_timeout=args.exit_timeout_secs,
        loader=ConfigOptions(
            auto_complete=not (args.strict_model_config or args.disable_auto_complete_config),
            model_config_name=args.model_config_name,
            instance_kind=args.instance_kind,
        ),
    )
    try:
        uvloop.run(serve(options))
    except StartupError as exc:
        print(f"error: creating server: Internal - {exc}", file=sys.stderr)
        return 1
    return 0
