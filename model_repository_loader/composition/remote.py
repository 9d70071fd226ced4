"""The seam to models served by other processes: what BLS and ensembles call for a name that is
not loaded here.

The loader knows nothing of how other processes are reached. Whoever serves this process (the
Dynamo bridge) installs a `RemoteModels` with `composition.set_remote_models`; BLS
(bls.py) and ensemble steps (ensemble.py) use it only for a name that is not in the local
`models` (a local target always goes straight in-process, with no copy).

- `find(name)` says whether another process serves `name`, with its versions and config, so that
  BLS can give Triton's answers (unknown version, decoupled target) before sending anything. It
  may block: call it from a model's thread, never from the event loop that serves requests.
- `submit(name, request, respond)` never blocks. Every outcome comes back through `respond`, from
  whatever thread: each response in order, the last one with `final`, and `rejected` true when
  the target's request checks (or an unknown version, a closing model) refused the request
  before the model saw it, which is when Triton's BLS prefixes the text with the model's name. A
  target that no process serves (any more: `find` saw it, then it went away) is answered
  `respond(None, True, True)`, rejected with no response, and the caller words it (BLS: "not
  ready", an ensemble: unknown model). The returned `RemoteCall.cancel()` asks the target to
  stop, as `Pending.cancel()` does locally.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as mc

from ..inference import InferRequest
from ..pb_utils import InferenceResponse

# respond(response or None for a flag-only final, final, rejected); (None, True, True): no
# process serves the target.
RemoteRespond = Callable[[InferenceResponse | None, bool, bool], None]


@dataclass(frozen=True, slots=True)
class RemoteTarget:
    """A model another process serves: its versions and its (served) config."""

    name: str
    versions: frozenset[int]
    config: mc.ModelConfig

    @property
    def decoupled(self) -> bool:
        return bool(self.config.model_transaction_policy.decoupled)


class RemoteCall(Protocol):
    def cancel(self) -> None:
        """Ask the target to stop (its request is cancelled); idempotent, any thread."""


class RemoteModels(Protocol):
    def find(self, name: str) -> RemoteTarget | None:
        """The target serving `name` in another process, or None. May block (not on the loop)."""

    def submit(self, name: str, request: InferRequest, respond: RemoteRespond) -> RemoteCall:
        """Send `request` to `name` in another process; never blocks (see the module doc)."""
