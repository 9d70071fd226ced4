"""Load a whole model repository, or one model of it, as Triton does at start-up.

A model that fails to load never stops the others: it is reported with Triton's reason text and
the rest are served. Whether that failure should end the server is the caller's decision
(`--exit-on-error`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from . import pb_utils, repository
from .config import (
    ConfigError,
    ConfigOptions,
    config_file_exists,
    config_to_args_json,
    finalize_config,
    read_model_config,
)
from .errors import ModelLoadError
from .importer import import_model_module
from .model import Model, ModelVersion
from .repository import ModelSource

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
    models: dict[str, Model] = field(default_factory=dict)
    statuses: dict[str, ModelStatus] = field(default_factory=dict)

    @property
    def failures(self) -> dict[str, str]:
        return {n: s.reason for n, s in self.statuses.items() if not s.ready}

    def close(self) -> None:
        for model in self.models.values():
            model.close()


def load_repository(
    paths: Iterable[Path | str],
    options: ConfigOptions = ConfigOptions(),
    only: Iterable[str] | None = None,
) -> LoadedRepository:
    """Load every model under `paths` (or just the names in `only`)."""
    wanted = set(only) if only is not None else None
    loaded = LoadedRepository()
    for source in repository.scan([Path(p) for p in paths]):
        if wanted is not None and source.name not in wanted:
            continue
        status = ModelStatus(source.name)
        loaded.statuses[source.name] = status
        try:
            model = load_model(source, options)
        except ModelLoadError as exc:
            status.reason = str(exc)
            status.versions = [exc.version] if exc.version is not None else []
            log.error("failed to load '%s': %s", source.name, exc)
            continue
        loaded.models[source.name] = model
        status.versions = sorted(model.versions)
        status.ready = True
    return loaded


def load_model(source: ModelSource, options: ConfigOptions = ConfigOptions()) -> Model:
    """Load every served version of one model; raises ModelLoadError with Triton's reason."""
    loaded: dict[int, ModelVersion] = {}
    number: int | None = None
    try:
        config = read_model_config(source, options)
        config_provided = config_file_exists(source, options)
        for number in repository.select_versions(source, config):
            final = _version_config(source, number, config, options, config_provided)
            model_file = repository.model_file(source, number, final)
            version = ModelVersion(
                source.name, number, final, config_to_args_json(final), model_file
            )
            version.load()
            loaded[number] = version
    except (ConfigError, ModelLoadError) as exc:
        for version in loaded.values():
            version.close()
        # A per-version failure reads "<code words>: <reason>" in Triton ("Internal: ..."),
        # as instance failures already do; poll and version-policy failures are bare.
        reason = exc.status_text if isinstance(exc, ConfigError) and exc.stage == "load" else exc
        raise ModelLoadError(str(reason), version=number) from None
    return Model(source.name, loaded)


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


def _model_class(model_file: Path) -> type:
    """Import model.py once, only to reach `TritonPythonModel.auto_complete_config`."""
    return getattr(import_model_module(model_file), "TritonPythonModel", None)
