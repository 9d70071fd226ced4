"""Which kind an instance is: a thread in this process, or a process of its own.

The rule, in order:
1. the model's config parameter `BRIDGE_INSTANCE_KIND` ("thread", "process" or "auto");
2. otherwise the server default (`--instance-kind`, "auto" unless set);
3. "auto" means: a process per instance when the instance group asks for more than one
   instance, a thread otherwise.

Why: Triton runs every instance in its own process, and users who set `count: 4` expect four
instances to compute in parallel, which needs processes past the GIL. A single instance gains
nothing in parallelism from a process and pays a hop per request, so it stays a thread (lowest
latency); set `process` for crash isolation of a single instance too.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ModelLoadError

PARAMETER = "BRIDGE_INSTANCE_KIND"
KINDS = ("auto", "thread", "process")


def runs_in_process(config: mc.ModelConfig, group: mc.ModelInstanceGroup, default: str) -> bool:
    """True if the instances of `group` each get a process of their own."""
    kind = default
    if PARAMETER in config.parameters:
        kind = config.parameters[PARAMETER].string_value.strip().lower()
        if kind not in KINDS:
            raise ModelLoadError(
                f"Invalid argument: parameter '{PARAMETER}' of model '{config.name}' is "
                f"'{config.parameters[PARAMETER].string_value}'; expected one of: "
                + ", ".join(KINDS)
            )
    if kind == "auto":
        return group.count > 1
    return kind == "process"
