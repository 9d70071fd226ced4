"""Test model repositories whose models share code, written out whole before use.

Several fixture models differ from another only in their name and config.pbtxt (a thread and a
process instance kind, a batching and a plain config, two priorities of one rate limiter
resource), and some repositories hold the very same model as another (the cross-worker BLS
repositories serve composition's models). Their code lives once, in the model named in
SAME_CODE; a model that differs in its config keeps only its config.pbtxt, and one that differs
in nothing is not in its repository at all. `materialize` copies such a repository into a folder
of the test's and completes it, so that Triton (the oracle) and the bridge load the very same
files: call it once and hand the one path to both (the `repository` fixture, tests/conftest.py,
does so once per session).

The differential tests compare behaviour with real Triton, so the copy must be what a user's
repository would be: plain files, no links (a link may be refused or resolved elsewhere).
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPOSITORIES = Path(__file__).resolve().parents[1] / "repositories"
# What a run of the source tree may have left beside the models: not part of a repository.
_NOT_COPIED = shutil.ignore_patterns("__pycache__")

# {repository: {model: the model whose code it runs}}: "model" in the same repository, or
# "repository/model" in another. A model folder with only its config gets the template's version
# folders; a model with no folder of its own is the template's whole folder.
SAME_CODE: dict[str, dict[str, str]] = {
    "rate_limiter": {"shared_b": "shared_a", "heavy": "gate_hold", "light": "gate_hold"},
    "stream_flood": {"flood_process": "flood"},
    "response_sender": {"sender_batching": "sender", "sender_process": "sender"},
    "argv": {"argv_process": "argv", "unittest_main_process": "unittest_main"},
    "isolation": {"thread_pids": "proc_pids"},
    "metrics": {"counted_process": "counted"},
    "introspect": {"init_args_plain": "init_args", "named_groups": "two_instances"},
    "load_failures": {
        "bad_pbtxt": "healthy",
        "name_mismatch": "healthy",
        "platform_python": "healthy",
    },
    # Every identity model but bf16 (it uses dlpack) differs from identity_bytes in its config.
    "dtypes": {
        "identity_bool": "identity_bytes",
        "identity_bool_nobatch": "identity_bytes",
        "identity_bytes_nobatch": "identity_bytes",
        "identity_fp16": "identity_bytes",
        "identity_fp32": "identity_bytes",
        "identity_fp32_nobatch": "identity_bytes",
        "identity_fp64": "identity_bytes",
        "identity_int16": "identity_bytes",
        "identity_int32": "identity_bytes",
        "identity_int64": "identity_bytes",
        "identity_int64_nobatch": "identity_bytes",
        "identity_int8": "identity_bytes",
        "identity_uint16": "identity_bytes",
        "identity_uint32": "identity_bytes",
        "identity_uint64": "identity_bytes",
        "identity_uint8": "identity_bytes",
    },
    # The scheduler models differ only in their configs.
    "batching": {
        "default_sched": "dyn_delay",
        "dyn_no_delay": "dyn_delay",
        "dyn_ordered": "dyn_delay",
        "dyn_preferred": "dyn_delay",
        "dyn_two_instances": "dyn_delay",
        "dyn_unbatched": "dyn_delay",
        "groups": "dyn_delay",
        "priorities": "dyn_delay",
        "queue_delay_action": "dyn_delay",
        "queue_full": "dyn_delay",
        "queue_timeout": "dyn_delay",
        "stacked": "dyn_delay",
        "timeout_override": "dyn_delay",
    },
    "sequence": {
        "seq_idle": "seq_direct",
        "seq_oldest": "seq_direct",
        "seq_unbatched": "seq_direct",
    },
    "response_cache": {"cached_batched": "cached", "uncached": "cached"},
    # The end-to-end repositories' working models: `healthy` under other names and configs.
    "e2e_load_failures": {"bad_config": "healthy"},
    "e2e_multi_a": {"alpha": "e2e_load_failures/healthy", "common": "e2e_load_failures/healthy"},
    "e2e_multi_b": {"beta": "e2e_load_failures/healthy", "common": "e2e_load_failures/healthy"},
    "e2e_no_config": {"configured": "e2e_load_failures/healthy"},
    "cluster_a": {
        "bls": "composition/bls",
        "bls_async": "composition/bls_async",
        "bls_isolated": "composition/bls",
        "scale": "composition/scale",
        "to_float": "composition/to_float",
    },
    "cluster_b": {
        "add_sub": "composition/add_sub",
        "echo_request": "composition/echo_request",
        "identity_bytes": "dtypes/identity_bytes",
        "raiser": "composition/raiser",
        "repeat_dec": "composition/repeat_dec",
        "versioned": "composition/versioned",
    },
    "tracing": {"scale": "composition/scale"},
}


def _template(repository: str, model: str) -> Path | None:
    template = SAME_CODE.get(repository, {}).get(model)
    if template is None:
        return None
    return REPOSITORIES / (template if "/" in template else f"{repository}/{template}")


def _complete(repository: str, model: str, target: Path) -> None:
    """`target` (the model's folder in a copy) given what SAME_CODE says it shares."""
    template = _template(repository, model)
    if template is None:
        return
    if not target.exists():
        shutil.copytree(template, target, ignore=_NOT_COPIED)
        return
    for version in template.iterdir():
        if version.is_dir() and version.name.isdigit():
            # dirs_exist_ok: a checkout that held the old per-model copies keeps their version
            # folders (only __pycache__ left in them, which git does not remove), copied empty.
            shutil.copytree(
                version, target / version.name, ignore=_NOT_COPIED, dirs_exist_ok=True
            )


def materialize(name: str, into: Path) -> Path:
    """The repository `name` of tests/repositories, whole, at `into`/`name` (returned)."""
    target = into / name
    shutil.copytree(REPOSITORIES / name, target, ignore=_NOT_COPIED)
    for model in SAME_CODE.get(name, {}):
        _complete(name, model, target / model)
    return target


def materialize_model(repository: str, model: str, into: Path) -> Path:
    """One model of `repository`, whole, at `into`/`model` (returned)."""
    source = REPOSITORIES / repository / model
    target = into / model
    if source.exists():
        shutil.copytree(source, target, ignore=_NOT_COPIED)
    _complete(repository, model, target)
    return target


__all__ = ["REPOSITORIES", "SAME_CODE", "materialize", "materialize_model"]
