"""`--grpc-restricted-protocol`: protocol groups open only to calls carrying a header, as in
tritonserver.

`--grpc-restricted-protocol=<group>[,<group>...]:<key>=<value>` (repeatable, each group in one
value at most): every RPC of those groups must carry the gRPC metadata `<key>: <value>`; any other
call gets UNAVAILABLE "This protocol is restricted, expecting header '<key>'" before its request
is read, as Triton answers it. The groups and their RPCs are Triton's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc

from ....restrictions import GROUPS as GROUP_NAMES
from ....restrictions import Restriction, parse_restrictions

GROUPS: dict[str, tuple[str, ...]] = {
    "health": ("ServerLive", "ServerReady", "ModelReady"),
    "metadata": ("ServerMetadata", "ModelMetadata"),
    "inference": ("ModelInfer", "ModelStreamInfer"),
    "shared-memory": (
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
    ),
    "model-config": ("ModelConfig",),
    "model-repository": ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"),
    "statistics": ("ModelStatistics",),
    "trace": ("TraceSetting",),
    "logging": ("LogSettings",),
}
FLAG = "--grpc-restricted-protocol"
assert set(GROUPS) == set(GROUP_NAMES)  # the same groups as HTTP's, with their RPCs here


def parse_restricted_protocol(specs: list[str]) -> dict[str, Restriction]:
    """The flag's values as {group: Restriction}; ValueError with tritonserver's kind of text."""
    return parse_restrictions(
        specs, FLAG, "protocol", "<protocol_name>:<restricted_key>=<restricted_value>"
    )


class RestrictedProtocols(grpc.ServerInterceptor):
    """Refuses the calls of restricted groups that lack their header."""

    def __init__(self, restrictions: Mapping[str, Restriction]) -> None:
        self._by_method = {
            method: restriction
            for group, restriction in restrictions.items()
            for method in GROUPS[group]
        }

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method.rpartition("/")[2]
        restriction = self._by_method.get(method)
        if restriction is not None:
            metadata = handler_call_details.invocation_metadata or ()
            headers = {k.lower(): v for k, v in metadata if isinstance(v, str)}
            if not restriction.allows(headers):
                return _refusal(method, restriction.header)
        return continuation(handler_call_details)


def _refusal(method: str, header: str) -> grpc.RpcMethodHandler:
    text = f"This protocol is restricted, expecting header '{header}'"

    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAVAILABLE, text)

    def refuse_stream(requests: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        context.abort(grpc.StatusCode.UNAVAILABLE, text)
        yield  # a generator, as a stream handler is

    if method == "ModelStreamInfer":
        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    return grpc.unary_unary_rpc_method_handler(refuse)
