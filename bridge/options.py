"""What the command line decided, handed to the composition root (server.py) and the roles."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from model_repository_loader.config import ConfigOptions

from .metrics.triton import MetricsConfig
from .restrictions import Restriction

if TYPE_CHECKING:
    from .frontends.triton import DoorOptions


@dataclass(frozen=True, slots=True)
class ServerOptions:
    model_repositories: list[Path] = field(default_factory=list)  # none for --role frontend
    role: str = "all"  # all | worker | frontend
    discovery_backend: str = "mem"  # mem | file | etcd | kubernetes
    request_plane: str = "tcp"  # tcp | nats
    grpc_port: int = 8001
    metrics_port: int = 8002
    allow_metrics: bool = True
    metrics_address: str = "127.0.0.1"
    metrics_config: MetricsConfig = field(default_factory=MetricsConfig)
    host: str = "127.0.0.1"
    namespace: str = "dynamo_bridge"
    exit_on_error: bool = False
    loader: ConfigOptions = field(default_factory=ConfigOptions)
    model_control_mode: str = "poll"
    load_models: tuple[str, ...] = ()  # explicit mode's start-up set; "*" = all
    control_port: int | None = None
    reload_debounce: float = 0.5
    # `--http-restricted-api`: {api group: header the requests must carry}
    http_restricted_api: dict[str, Restriction] = field(default_factory=dict)
    exit_timeout: float = 30.0  # tritonserver's --exit-timeout-secs
    door: DoorOptions | None = None  # `--frontend triton` and its TLS options; None = dynamo


class StartupError(Exception):
    """The server must not start (a model failed to load with --exit-on-error)."""
