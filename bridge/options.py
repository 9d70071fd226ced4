"""What the command line decided, handed to the composition root (server.py) and the roles."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from model_repository_loader.config import ConfigOptions
from model_repository_loader.gpu.devices import GpuDevice
from model_repository_loader.scheduling.rate_limiter import ResourceLimit

from .frontends.triton.http.connections import ConnectionLimits
from .frontends.triton.http.limits import DEFAULT_MAX_INPUT_SIZE
from .frontends.triton.shm import DEFAULT_MAX_REGIONS
from .metrics.triton import MetricsConfig
from .restrictions import Restriction
from .serialized_bytes import BytesLimits
from .tracing.config import TraceConfig

if TYPE_CHECKING:
    from .frontends.triton import DoorOptions, HttpOptions


@dataclass(frozen=True, slots=True)
class Timings:
    """The server's own waits, in seconds. Each is also `DYN_BRIDGE_<NAME>` in the environment
    (`DYN_BRIDGE_ROUTE_QUIET_SECS=1`); the defaults are what the tests and benchmarks measured.
    """

    # Hot reload: a retired generation is withdrawn once no request has reached it for this
    # long (frontends route elsewhere; Dynamo 1.6 has no confirmation of that) ...
    route_quiet_secs: float = 0.5
    # ... and at most after this long; then it is closed, waited for at most close_timeout.
    drain_timeout_secs: float = 60.0
    close_timeout_secs: float = 60.0
    # A load still running after this long is logged, then again at each doubling.
    slow_load_warning_secs: float = 10.0
    # A worker with no frontend in its process cannot ask the frontends elsewhere whether they
    # see a new generation: they get this long before the old one is withdrawn (measured with
    # file discovery under load: at once gave NOT_FOUND for a moment, 0.3 s none).
    remote_frontend_grace_secs: float = 1.0
    # Shutdown: after the model cards are gone, the longest wait for requests to stop arriving
    # before the instance records go too (a caller routing on instances never goes quiet).
    routes_quiet_max_secs: float = 5.0
    # A rolling restart: once the last worker serving a model has left discovery, the door
    # answers UNAVAILABLE (which clients retry) for this long, then Triton's NOT_FOUND.
    departed_grace_secs: float = 30.0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Timings:
        """The defaults, with each `DYN_BRIDGE_<NAME>` that is set; ValueError naming a bad one."""
        changes: dict[str, float] = {}
        for setting in fields(cls):
            name = "DYN_BRIDGE_" + setting.name.upper()
            text = environ.get(name)
            if not text:
                continue
            try:
                value = float(text)
            except ValueError:
                value = -1.0
            if not value >= 0:
                raise ValueError(f"{name}: '{text}' is not a number of seconds >= 0")
            changes[setting.name] = value
        return replace(cls(), **changes)


@dataclass(frozen=True, slots=True)
class ServerOptions:
    model_repositories: list[Path] = field(default_factory=list)  # none for --role frontend
    role: str = "all"  # all | worker | frontend
    discovery_backend: str = "mem"  # mem | file | etcd | kubernetes
    request_plane: str = "tcp"  # tcp | nats
    grpc_port: int = 8001
    metrics_port: int = 8002
    allow_metrics: bool = True
    # `--allow-gpu-metrics`: the `nv_gpu_*` families of `gpus` on the metrics port.
    allow_gpu_metrics: bool = True
    # The GPUs this process's models may use (gpu/devices.py; none for --role frontend).
    gpus: tuple[GpuDevice, ...] = ()
    # A lost etcd lease: exit 1 (a supervisor restarts) rather than re-execute this process
    # once etcd answers (bridge/roles/discovery.py).
    exit_on_lease_loss: bool = False
    metrics_address: str = "127.0.0.1"
    metrics_config: MetricsConfig = field(default_factory=MetricsConfig)
    # `--cache-config local,size=N`: the response cache of each worker process (0: none).
    response_cache_bytes: int = 0
    trace: TraceConfig = field(default_factory=TraceConfig)  # --trace-config (the triton door)
    host: str = "127.0.0.1"
    namespace: str = "dynamo_bridge"
    exit_on_error: bool = False
    # tritonserver's --strict-readiness: the server is ready only while every model is.
    strict_readiness: bool = True
    # tritonserver's --allow-client-shm (2.70 on): clients may register shared memory regions.
    allow_client_shm: bool = False
    # `--max-shm-regions`: the most client regions (system and CUDA) the door holds at once.
    max_shm_regions: int = DEFAULT_MAX_REGIONS
    loader: ConfigOptions = field(default_factory=ConfigOptions)
    model_control_mode: str = "poll"
    load_models: tuple[str, ...] = ()  # explicit mode's start-up set; "*" = all
    control_port: int | None = None
    reload_debounce: float = 0.5
    # `--http-restricted-api`: {api group: header the requests must carry}
    http_restricted_api: dict[str, Restriction] = field(default_factory=dict)
    exit_timeout: float = 30.0  # tritonserver's --exit-timeout-secs
    door: DoorOptions | None = None  # `--frontend triton` and its TLS options; None = dynamo
    http: HttpOptions | None = None  # the triton door's HTTP wire (`--http-port`, ...)
    # Every HTTP listener's deadlines and connection cap (the triton door's HTTP port, the
    # control port, the metrics port): `--http-header-timeout-secs`, ...
    http_limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    # `--http-max-input-size`: the triton door's HTTP port (also in `http`) and the control
    # port, whatever the front door.
    http_max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    timings: Timings = field(default_factory=Timings)
    # `--max-bytes-elements`, `--max-bytes-decoded-size`: the door's checks and the workers'.
    bytes_limits: BytesLimits = field(default_factory=BytesLimits)
    # `--rate-limit` (execution_count | off) and `--rate-limit-resource name:count[:device]`.
    rate_limit: str = "off"
    rate_limit_resources: tuple[ResourceLimit, ...] = ()


class StartupError(Exception):
    """The server must not start (a model failed to load with --exit-on-error)."""
