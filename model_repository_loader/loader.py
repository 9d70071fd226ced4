"""Load a whole model repository, or one model of it, as Triton does at start-up.

A model that fails to load never stops the others: it is reported with Triton's reason text and
the rest are served. Whether that failure should end the server is the caller's decision
(`--exit-on-error`).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from . import composition, pb_utils, repository
from .composition import Scope
from .config import (
    PYTHON_BACKEND,
    ConfigError,
    ConfigOptions,
    config_file_exists,
    config_from_json,
    config_to_args_json,
    finalize_config,
    polled_config,
    read_model_config,
)
from .deadlines import remaining
from .errors import ModelLoadError
from .importer import import_model_module
from .model import Model, ModelVersion, ServedModel, side_by_side
from .pb_utils.metrics import MetricRegistry
from .repository import ModelSource
from .response_cache import ResponseCache
from .scheduling.rate_limiter import RateLimiter

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ModelStatus:
    """One row of the start-up table: a model's versions and whether they are serving."""

    name: str
    versions: list[int] = field(default_factory=list)
    ready: bool = False
    reason: str = ""

    @property
    def state(self) -> str:
        return "READY" if self.ready else "UNAVAILABLE"


@dataclass(slots=True)
class LoadedRepository:
    """The models of a repository, and what they reach through pb_utils.

    `scope`: what their BLS calls and ensemble steps reach (this very `models` dict, read at call
    time, then `scope.remote` when a server sets one); `services`: their BLS executor, model
    control (set by a server) and custom metrics registry. Both belong to this repository only.
    `rate_limiter`: the one limiter every instance of its models runs under (`--rate-limit
    execution_count`), or None (`off`, Triton's default).
    `cache`: the response cache its models share (`--cache-config`); None: the server has none.
    """

    models: dict[str, ServedModel] = field(default_factory=dict)
    statuses: dict[str, ModelStatus] = field(default_factory=dict)
    rate_limiter: RateLimiter | None = None
    cache: ResponseCache | None = None
    scope: Scope = field(init=False)
    services: pb_utils.ModelServices = field(init=False)
    metrics: MetricRegistry = field(init=False)  # its models' custom metric families

    @property
    def failures(self) -> dict[str, str]:
        return {n: s.reason for n, s in self.statuses.items() if not s.ready}

    def __post_init__(self) -> None:
        self.scope = Scope(self.models, self.statuses)
        self.metrics = MetricRegistry()
        self.services = pb_utils.ModelServices(
            bls=composition.BlsExecutor(self.scope), metrics=self.metrics
        )

    def close(self, timeout: float | None = 30.0) -> bool:
        """Close every model side by side; `timeout` bounds the whole (False if reached)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        closes = [
            (name, lambda model=model: model.close(remaining(deadline)))
            for name, model in self.models.items()
        ]
        finished = side_by_side(closes, deadline, "close")
        self.services.retire()
        return finished


def load_repository(
    paths: Iterable[Path | str],
    options: ConfigOptions = ConfigOptions(),
    only: Iterable[str] | None = None,
    into: LoadedRepository | None = None,
) -> LoadedRepository:
    """Load every model under `paths` (or just the names in `only`).

    `into`: an empty LoadedRepository to fill (a server sets its `services.control` first, so
    the models' `initialize` already reaches it); by default a new one.
    """
    wanted = set(only) if only is not None else None
    loaded = into if into is not None else LoadedRepository()
    sources = [
        s for s in repository.scan([Path(p) for p in paths]) if wanted is None or s.name in wanted
    ]
    for source in sources:
        loaded.statuses[source.name] = ModelStatus(source.name)
    # Ensembles load after the models they use; cycles and unknown steps fail up front.
    ordered, early_failures = composition.load_order(sources, options, loaded.scope)
    for name, reason in early_failures.items():
        loaded.statuses[name].reason = reason
        log.error("failed to load '%s': %s", name, reason)
    for source in ordered:
        status = loaded.statuses[source.name]
        try:
            model = load_model(source, options, within=loaded)
        except ModelLoadError as exc:
            status.reason = str(exc)
            status.versions = [exc.version] if exc.version is not None else []
            log.error("failed to load '%s': %s", source.name, exc)
            continue
        loaded.models[source.name] = model
        status.versions = sorted(model.versions)
        status.ready = True
    return loaded


def load_model(
    source: ModelSource,
    options: ConfigOptions = ConfigOptions(),
    within: LoadedRepository | None = None,
) -> ServedModel:
    """Load every served version of one model; raises ModelLoadError with Triton's reason.

    `within`: the repository the model is for. Its BLS calls, ensemble steps, model control and
    custom metrics are that repository's (`scope`, `services`); None: a model on its own.
    """
    if _is_ensemble(source, options):
        return composition.load_ensemble(source, options, _scope(within), cache=_cache(within))
    try:
        config = read_model_config(source, options)
    except ConfigError as exc:
        raise PollError(str(exc)) from None
    provided = config_file_exists(source, options)
    _refuse_other_backends(source, config)
    return _load_versions(
        source, config, options, provided, _services(within), _limiter(within), _cache(within)
    )


def _refuse_other_backends(source: ModelSource, config: mc.ModelConfig) -> None:
    """A model of another backend (TensorRT, ONNX Runtime, ...) gets a load error that says so,
    rather than "Python model file not found" about its `model.plan`."""
    if config.backend != PYTHON_BACKEND:
        kind = f"backend '{config.backend}'" + (
            f", platform '{config.platform}'" if config.platform else ""
        )
        raise ModelLoadError(
            f"not served: this server runs Python-backend models (and ensembles of them); "
            f"'{source.name}' is a model of {kind}"
        )


def _scope(within: LoadedRepository | None) -> Scope | None:
    return within.scope if within is not None else None


def _services(within: LoadedRepository | None) -> pb_utils.ModelServices | None:
    return within.services if within is not None else None


def _cache(within: LoadedRepository | None) -> ResponseCache | None:
    return within.cache if within is not None else None


def _limiter(within: LoadedRepository | None) -> RateLimiter | None:
    return within.rate_limiter if within is not None else None


def _load_versions(
    source: ModelSource,
    config: mc.ModelConfig,
    options: ConfigOptions,
    config_provided: bool,
    services: pb_utils.ModelServices | None,
    rate_limiter: RateLimiter | None = None,
    cache: ResponseCache | None = None,
) -> Model:
    loaded: dict[int, ModelVersion] = {}
    number: int | None = None
    try:
        for number in repository.select_versions(source, config):
            final = _version_config(source, number, config, options, config_provided)
            model_file = repository.model_file(source, number, final)
            version = ModelVersion(
                source.name,
                number,
                final,
                config_to_args_json(final),
                model_file,
                instance_kind=options.instance_kind,
                environment_limits=options.environment_limits,
                services=services,
                rate_limiter=rate_limiter,
                cache=cache,
            )
            version.load()
            loaded[number] = version
    except (ConfigError, ModelLoadError) as exc:
        for version in loaded.values():
            version.close()
        raise ModelLoadError(str(_reason(exc)), version=number) from None
    return Model(source.name, loaded)


def _reason(exc: ConfigError | ModelLoadError) -> object:
    # A per-version failure reads "<code words>: <reason>" in Triton ("Internal: ..."), as
    # instance failures already do; poll and version-policy failures are bare.
    return exc.status_text if isinstance(exc, ConfigError) and exc.stage == "load" else exc


def _is_ensemble(source: ModelSource, options: ConfigOptions) -> bool:
    """`platform: "ensemble"`: no model.py, its steps are other models (composition/)."""
    try:
        return read_model_config(source, options).platform == "ensemble"
    except ConfigError:
        return False  # the normal path reports it


def _version_config(
    source: ModelSource,
    version: int,
    config: mc.ModelConfig,
    options: ConfigOptions,
    config_provided: bool,
) -> mc.ModelConfig:
    # auto_complete_config runs with the model's context bound, so pb_utils.get_model_dir()
    # and Logger work in it, and BLS is refused as Triton refuses it there.
    with (
        pb_utils.context.model_context(
            model_name=source.name,
            instance_name=source.name,
            version_dir=str(source.version_path(version)),
        ),
        pb_utils.context.phase("auto_complete"),
    ):
        return finalize_config(
            config, source, version, options, _model_class, config_provided=config_provided
        )


def _model_class(model_file: Path) -> type | None:
    """Import model.py once, only to reach `TritonPythonModel.auto_complete_config`."""
    return getattr(import_model_module(model_file), "TritonPythonModel", None)


# -- loading with an override (the model loading API's `config=` / `files=`) --------------------


class PollError(ModelLoadError):
    """The model could not even be read (Triton's "failed to poll from model repository")."""


def override_source(name: str, files: dict[str, bytes], root: Path) -> ModelSource:
    """Write `files` (`{"file:<version>/<name>": bytes}`) as the new model folder `root/name`.

    As in Triton, the files replace the model's folder entirely, and a key's path is relative to
    that folder even with a leading slash (`file:/1/model.py`). Raises PollError, having written
    nothing, for a name that is not one safe folder name, for keys without the `file:` prefix, and
    for paths that would leave the folder (Triton's "must stay within model directory") or that
    cannot be written. `root` is the caller's: it removes it once the model is unloaded or fails.
    """
    reason = repository.invalid_model_name(name)
    if reason is not None:
        raise PollError(reason)
    model_dir = root / name
    try:
        model_dir.mkdir(parents=True)
    except OSError as exc:  # never write into (or remove) a folder this call did not create
        raise PollError(f"cannot create the model folder: {exc}") from None
    try:
        real_dir = model_dir.resolve()
        for key, data in files.items():
            _write_override_file(real_dir, key, data)
    except BaseException as exc:
        shutil.rmtree(model_dir, ignore_errors=True)
        if isinstance(exc, OSError | ValueError):
            raise PollError(f"failed to write the model files: {exc}") from None
        raise
    return ModelSource(name, model_dir, root)


def _write_override_file(model_dir: Path, key: str, data: bytes) -> None:
    relative = key.removeprefix("file:")
    if not key.startswith("file:") or not relative or "\0" in relative:
        raise PollError(f"invalid file parameter '{key}'")
    # Triton appends the path to the model folder (its JoinPath), so "file:/1/model.py" is
    # 1/model.py inside it; Path's `/` would take a leading slash as the file system's root.
    target = (model_dir / relative.lstrip("/")).resolve()
    if target == model_dir or not target.is_relative_to(model_dir):
        raise PollError(
            f"Invalid file parameter '{key}' with normalized path '{target}' must stay within "
            "model directory."
        )
    if target.parent.exists() and not target.parent.is_dir():
        raise PollError(f"Invalid file parameter '{key}', directory has been created as a file")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data if isinstance(data, bytes) else str(data).encode())


def load_model_with_config(
    source: ModelSource,
    config_json: str,
    options: ConfigOptions = ConfigOptions(),
    within: LoadedRepository | None = None,
) -> ServedModel:
    """Load `source` with `config_json` (Triton's JSON form) in place of its config.pbtxt.

    The override is the whole configuration, not a patch [V: an override of only
    `max_batch_size` serves a config with no inputs]. A config that cannot be parsed or fails
    the repository checks raises PollError; a version that fails raises ModelLoadError.
    """
    try:
        config = polled_config(config_from_json(config_json), source, options)
    except (ConfigError, ValueError) as exc:
        raise PollError(f"Invalid config override: {exc}") from None

    if config.platform == "ensemble":
        return composition.load_ensemble(
            source, options, _scope(within), config=config, cache=_cache(within)
        )
    return _load_versions(
        source, config, options, True, _services(within), _limiter(within), _cache(within)
    )
