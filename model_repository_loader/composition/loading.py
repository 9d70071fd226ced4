"""Loading ensembles: after their composing models, checked against those models' configs.

Triton builds a dependency graph of the repository first: an ensemble that names a model the
repository does not have, or that is part of a cycle of ensembles, fails before anything loads.
Composing models load first; then each ensemble is checked against their configs (tensor names,
datatypes, shapes) and becomes decoupled when a composing model is. Texts are Triton 2.51's [V]
(tests/repositories/composition: the `bad_*` and `cycle_*` models).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from .. import repository
from ..config import ConfigError, ConfigOptions, finalize_config, read_model_config
from ..config.normalize import ENSEMBLE_PLATFORM
from ..errors import ModelLoadError
from ..repository import ModelSource
from ..response_cache import ResponseCache
from .ensemble import EnsembleModel
from .scope import Scope


def step_models(config: mc.ModelConfig) -> list[str]:
    """The composing models an ensemble config names, in step order, once each."""
    names: list[str] = []
    for step in config.ensemble_scheduling.step:
        if step.model_name not in names:
            names.append(step.model_name)
    return names


def _peek(source: ModelSource, options: ConfigOptions) -> mc.ModelConfig | None:
    try:
        return read_model_config(source, options)
    except Exception:  # reported when the model itself is loaded
        return None


def load_order(
    sources: Iterable[ModelSource],
    options: ConfigOptions = ConfigOptions(),
    scope: Scope | None = None,
) -> tuple[list[ModelSource], dict[str, str]]:
    """Sources in load order (other models, then ensembles after what they use), and the
    ensembles that must fail before loading anything: {name: Triton's reason}."""
    sources = list(sources)
    names = {s.name for s in sources}
    ensembles: dict[str, list[str]] = {}
    for source in sources:
        config = _peek(source, options)
        if config is not None and config.platform == ENSEMBLE_PLATFORM:
            ensembles[source.name] = step_models(config)

    failures: dict[str, str] = {}
    for name, steps in ensembles.items():
        cycle = _cycle_from(name, ensembles)
        if cycle is not None:
            failures[name] = (
                f"circular dependency between ensembles: {name} -> ... -> {cycle} -> {name}"
            )
            continue
        missing = [s for s in steps if s not in names]
        # With other processes reachable, a step missing here may be served there: the
        # ensemble's own load (check_steps) looks.
        if missing and (scope is None or scope.remote is None):
            failures[name] = missing_steps_text(name, missing)

    ordered: list[ModelSource] = [s for s in sources if s.name not in ensembles]
    placed: set[str] = set()
    by_name = {s.name: s for s in sources}

    def place(name: str) -> None:
        if name in placed:
            return
        placed.add(name)
        for step in ensembles.get(name, []):
            if step in ensembles and step not in failures:
                place(step)
        if name not in failures:
            ordered.append(by_name[name])

    for name in sorted(ensembles):
        place(name)
    return ordered, failures


def _cycle_from(start: str, ensembles: Mapping[str, list[str]]) -> str | None:
    """The ensemble that leads back to `start`, if `start` is on a cycle of ensembles."""
    stack = [(start, iter(ensembles.get(start, [])))]
    seen = {start}
    while stack:
        name, steps = stack[-1]
        step = next(steps, None)
        if step is None:
            stack.pop()
            continue
        if step == start:
            return name
        if step in ensembles and step not in seen:
            seen.add(step)
            stack.append((step, iter(ensembles[step])))
    return None


def load_ensemble(
    source: ModelSource,
    options: ConfigOptions = ConfigOptions(),
    scope: Scope | None = None,
    config: mc.ModelConfig | None = None,
    cache: ResponseCache | None = None,
) -> EnsembleModel:
    """Load an ensemble whose composing models `scope` reaches (a repository's: loader.py).

    `config`: use this configuration instead of reading the folder's (a load-time override);
    `cache`: the server's response cache (used when the config enables it).

    Raises ModelLoadError with Triton's reason.
    """
    scope = scope if scope is not None else Scope()
    number: int | None = None
    try:
        if config is None:
            config = read_model_config(source, options)
        number = repository.select_versions(source, config)[-1]
        final = finalize_config(config, source, number, options)
    except ConfigError as exc:
        reason = exc.status_text if exc.stage == "load" else exc
        raise ModelLoadError(str(reason), version=number) from None
    decoupled = check_steps(final, scope)
    final.model_transaction_policy.decoupled = decoupled
    # Shares the scope, not a copy of its models: steps are looked up when they run.
    return EnsembleModel(source.name, number, final, scope, cache)


def check_steps(config: mc.ModelConfig, scope: Scope) -> bool:
    """Check every step against its composing model; True if one of them is decoupled."""
    name = config.name
    # Ensemble tensor -> (config, model it was inferred from); inputs/outputs come first.
    known: dict[str, tuple[Any, str]] = {}
    for io in [*config.input, *config.output]:
        known[io.name] = (io, name)
    decoupled = False
    for step in config.ensemble_scheduling.step:
        step_config = _step_config(name, step, scope)
        decoupled = decoupled or step_config.model_transaction_policy.decoupled
        inputs = {i.name: i for i in step_config.input}
        outputs = {o.name: o for o in step_config.output}
        for key, tensor in step.input_map.items():
            if key not in inputs:
                raise ModelLoadError(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing "
                    f"input {key} in model {step.model_name}"
                )
        for key, tensor in step.output_map.items():
            if key not in outputs:
                raise ModelLoadError(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing "
                    f"output {key} in model {step.model_name}"
                )
        mapped = [(t, inputs[k]) for k, t in step.input_map.items()]
        mapped += [(t, outputs[k]) for k, t in step.output_map.items()]
        for tensor, io in mapped:
            seen = known.get(tensor)
            if seen is None:
                known[tensor] = (io, step.model_name)
                continue
            _check_consistent(name, tensor, seen, (io, step.model_name))
    return decoupled


def _step_config(ensemble: str, step: Any, scope: Scope) -> mc.ModelConfig:
    """The config of the model (version) a step runs: a local model, else one another process
    serves (through the scope's RemoteModels). Raises ModelLoadError with Triton's texts."""
    model_name = step.model_name
    model = scope.models.get(model_name)
    if model is None:
        reason = scope.failure_reason(model_name)
        if reason is not None:
            raise ModelLoadError(
                f"ensemble '{ensemble}' depends on '{model_name}' which is not valid. "
                f"Model '{model_name}' failed with error: {reason}"
            )
        remote = scope.remote
        target = remote.find(model_name) if remote is not None else None
        if target is None:
            raise ModelLoadError(missing_steps_text(ensemble, [model_name]))
        _check_step_version(ensemble, step, target.versions)
        return target.config  # every version of a remote model is described by its config
    _check_step_version(ensemble, step, model.versions)
    version = model.versions[step.model_version] if step.model_version != -1 else model.latest
    return version.config


def _check_step_version(ensemble: str, step: Any, versions: Any) -> None:
    if step.model_version != -1 and step.model_version not in versions:
        raise ModelLoadError(
            f"ensemble '{ensemble}' depends on '{step.model_name}' whose required version "
            f"{step.model_version} is not loaded."
        )


def missing_steps_text(ensemble: str, missing: list[str]) -> str:
    """Triton's reason for an ensemble whose composing models are not there."""
    names = ", ".join(missing)
    return f"ensemble {ensemble} contains models that are not available or ambiguous: {names}"


def _check_consistent(
    ensemble: str, tensor: str, first: tuple[Any, str], second: tuple[Any, str]
) -> None:
    (a, a_model), (b, b_model) = first, second
    if a.data_type != b.data_type:
        raise ModelLoadError(
            f"in ensemble {ensemble}, ensemble tensor {tensor}: inconsistent data type: "
            f"{mc.DataType.Name(a.data_type)} is inferred from model {a_model} while "
            f"{mc.DataType.Name(b.data_type)} is inferred from model {b_model}"
        )
    a_dims, b_dims = list(a.dims), list(b.dims)
    compatible = len(a_dims) == len(b_dims) and all(
        x == y or -1 in (x, y) for x, y in zip(a_dims, b_dims, strict=True)
    )
    if not compatible:
        raise ModelLoadError(
            f"in ensemble {ensemble}, ensemble tensor {tensor}: inconsistent shape: "
            f"{_dims(a_dims)} is inferred from model {a_model} while {_dims(b_dims)} is "
            f"inferred from model {b_model}"
        )


def _dims(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"
