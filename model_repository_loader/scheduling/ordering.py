"""`preserve_ordering`: responses leave in the order their requests arrived.

Each request gets a ticket when it is queued. Responses of the oldest unfinished request go out
at once; later requests' responses wait until every earlier request has sent its final one.

A `respond` that raises ends its request (answered INTERNAL if it can be, as `Pending.deliver`
does) and the gate moves on, so one failed hand-over never holds back the requests behind it.

Responses that pass the gate are never held back for a slow client (the gate is shared: see
`inference.respond_may_wait`), and those queued behind an unfinished request are not bounded
either: a model with preserve_ordering gets no backpressure from its streams' clients.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .. import pb_utils
from ..execution import Pending, answer_failure
from ..inference import holding_a_shared_lock

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
        # holding the lock is what keeps two threads from interleaving out of order. So they
        # must not wait for their clients here (inference.respond_may_wait).
        with self._lock, holding_a_shared_lock():
            if ticket < self._head:
                return  # the request already ended (its respond failed)
            if ticket != self._head:
                self._held.setdefault(ticket, []).append((respond, response, final))
                return
            if not _hand_over(respond, response, final):
                return
            self._head += 1
            while self._head in self._held:
                finished = False
                for held_respond, held_response, held_final in self._held.pop(self._head):
                    if _hand_over(held_respond, held_response, held_final):
                        finished = True
                        break
                if not finished:
                    return
                self._head += 1


def _hand_over(respond: _Respond, response: pb_utils.InferenceResponse | None, final: bool) -> bool:
    """Call `respond`; True once the request is done (its final went, or respond failed)."""
    try:
        respond(response, final)
    except BaseException as exc:
        answer_failure(respond, exc)
        return True
    return final
