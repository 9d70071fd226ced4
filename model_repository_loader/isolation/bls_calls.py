"""BLS calls a model in an instance process makes, run in the server process.

The models a call may reach live in the server process (and, through the BLS executor, in other
Dynamo workers), so the child forwards each call as a `Bls` message; here it runs on a thread of
its own (it blocks until the target answers), and every response goes back as `BlsRespond`.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from .. import pb_utils
from .messages import Bls, BlsRespond, WireRequest, pack_response, unpack_request

if TYPE_CHECKING:
    from .instance import Child

log = logging.getLogger(__name__)


class BlsCalls:
    """BLS calls made by the model in the process, run here where the called models live.

    Every call gets a final answer, an error response if running it failed here: the model in
    the process waits for it.
    """

    def __init__(self, instance_name: str, services: pb_utils.ModelServices | None) -> None:
        self.instance_name = instance_name
        self.services = services  # the instance's repository's: its BLS executor runs the calls
        # Keyed by process too: call numbers start again at 1 in a restarted process.
        self._running: dict[tuple[Child, int], Any] = {}

    def start(self, child: Child, message: Bls) -> None:
        # A call blocks until its target answers: never on the reader thread.
        call, wire, decoupled = message.call, message.request, message.decoupled
        try:
            threading.Thread(
                target=self._run,
                args=(child, call, wire, decoupled),
                name="isolated-bls",
                daemon=True,
            ).start()
        except Exception as exc:
            child.folder.discard(wire.inputs)
            self._send(child, call, _bls_error(self.instance_name, exc), True)

    def _run(self, child: Child, call: int, wire: WireRequest, decoupled: bool) -> None:
        try:
            response = self._call(child, call, wire, decoupled)
        except Exception as exc:
            child.folder.discard(wire.inputs)
            response = _bls_error(self.instance_name, exc)
            log.error("%s", response.error().message())  # type: ignore[union-attr]
        self._send(child, call, response, True)

    def _call(
        self, child: Child, call: int, wire: WireRequest, decoupled: bool
    ) -> pb_utils.InferenceResponse | None:
        """Run the call; send every response but the last, and return that one."""
        owner = self.services or pb_utils.services.current()
        executor = owner.bls if owner is not None else None
        if executor is None:
            error = pb_utils.TritonError("BLS is not available: no model repository is loaded")
            return pb_utils.InferenceResponse(error=error)
        request = unpack_request(child.folder, wire, response_sender=None)
        result = executor(request, decoupled)
        if not isinstance(result, pb_utils.ResponseIterator):
            return result
        self._running[child, call] = result
        # Hold each response back by one, so the last one goes out flagged final (the
        # iterator already ends with Triton's empty response where there is one).
        last: pb_utils.InferenceResponse | None = None
        try:
            for response in result:
                if last is not None:
                    self._send(child, call, last, False)
                last = response
        finally:
            self._running.pop((child, call), None)
        return last

    def cancel(self, child: Child, call: int) -> None:
        iterator = self._running.get((child, call))
        if iterator is not None:
            iterator.cancel()

    def _send(
        self,
        child: Child,
        call: int,
        response: pb_utils.InferenceResponse | None,
        final: bool,
    ) -> None:
        try:
            wire = pack_response(child.folder, response)
        except Exception as exc:
            response = _bls_error(self.instance_name, exc)
            log.error("%s", response.error().message())  # type: ignore[union-attr]
            wire, final = pack_response(child.folder, response), True
        try:
            child.channel.send(BlsRespond(call, wire, final))
        except OSError:
            pass  # the process is gone; so is the caller


def _bls_error(name: str, exc: BaseException) -> pb_utils.InferenceResponse:
    message = f"BLS call from instance '{name}' failed in the server process: {exc!r}"
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(message, pb_utils.TritonError.INTERNAL)
    )
