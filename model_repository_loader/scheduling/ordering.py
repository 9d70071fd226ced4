"""`preserve_ordering`: responses leave in the order their requests arrived.

Each request gets a ticket when it is queued. Responses of the oldest unfinished request go out
at once; later requests' responses wait until every earlier request has sent its final one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .. import pb_utils
from ..execution import Pending

_Respond = Callable[[pb_utils.InferenceResponse | None, bool], None]


class InOrder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._issued = 0
        self._head = 0
        self._held: dict[int, list[tuple[_Respond, pb_utils.InferenceResponse | None, bool]]] = {}

    def wrap(self, pending: Pending) -> None:
        """Route the request's responses through the ordering gate."""
        with self._lock:
            ticket = self._issued
            self._issued += 1
        respond = pending._respond

        def ordered(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            self._arrive(ticket, respond, response, final)

        pending._respond = ordered

    def _arrive(
        self,
        ticket: int,
        respond: _Respond,
        response: pb_utils.InferenceResponse | None,
        final: bool,
    ) -> None:
        # Delivery happens under the lock: respond callbacks only hand the response over, and
        # holding the lock is what keeps two threads from interleaving out of order.
        with self._lock:
            if ticket != self._head:
                self._held.setdefault(ticket, []).append((respond, response, final))
                return
            respond(response, final)
            if not final:
                return
            self._head += 1
            while self._head in self._held:
                finished = False
                for held_respond, held_response, held_final in self._held.pop(self._head):
                    held_respond(held_response, held_final)
                    finished = finished or held_final
                if not finished:
                    return
                self._head += 1
