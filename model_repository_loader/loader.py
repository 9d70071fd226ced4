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

from . import config as model_config
from . import repository
from .errors import ModelLoadError, format_python_error
from .importer import ModelImportError, import_model_module
from .model import Model, ModelVersion
from .repository import ModelSource

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoaderOptions:
    """The tritonserver flags that change how models load."""

    auto_complete: bool = True  # off with --disable-auto-complete-config / --strict-model-config
    model_config_name: str | None = None  # --model-config-name


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
    paths: Iterable[Path],
    options: LoaderOptions = LoaderOptions(),
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
            log.error("failed to load '%s': %s", source.name, exc)
            continue
        loaded.models[source.name] = model
        status.versions = sorted(model.versions)
        status.ready = True
    return loaded


def load_model(source: ModelSource, options: LoaderOptions = LoaderOptions()) -> Model:
    """Load every served version of one model; raises ModelLoadError with Triton's reason."""
    try:
        config = model_config.load_config(source, options, _model_class_loader)
        versions = repository.select_versions(source, config)
        config_json = model_config.config_to_args_json(config)
    except model_config.ConfigError as exc:
        raise ModelLoadError(str(exc)) from None

    loaded: dict[int, ModelVersion] = {}
    try:
        for number in versions:
            try:
                model_file = repository.model_file(source, number, config)
            except model_config.ConfigError as exc:
                raise ModelLoadError(str(exc)) from None
            version = ModelVersion(source.name, number, config, config_json, model_file)
            version.load()
            loaded[number] = version
    except ModelLoadError:
        for version in loaded.values():
            version.close()
        raise
    return Model(source.name, loaded)


def _model_class_loader(model_file: Path) -> type | None:
    """Import model.py once, only to reach `TritonPythonModel.auto_complete_config`."""
    try:
        module = import_model_module(model_file)
    except ModelImportError as exc:
        raise ModelLoadError(str(exc)) from None
    except BaseException as exc:
        raise ModelLoadError(format_python_error(exc)) from None
    return getattr(module, "TritonPythonModel", None)
