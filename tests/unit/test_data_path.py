"""The request data path's hand-offs: Pending's cancellation and the worker's response queue.

These pieces were made lighter for speed (a flag instead of a threading.Event, one loop wake-up
per burst of responses); the tests pin down that nothing was lost on the way.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from bridge.models.endpoint import _GONE, RESPONSES_AHEAD, _Responses
from model_repository_loader import pb_utils
from model_repository_loader.execution import Pending
from model_repository_loader.inference import holding_a_shared_lock


def pending() -> Pending:
    request = pb_utils.InferenceRequest._incoming(
        inputs=[], requested_output_names={"OUT"}, response_sender=None
    )
    return Pending(request, lambda response, final: None, decoupled=True)


def test_cancel_is_seen_by_request_and_sender() -> None:
    p = pending()
    sender = p.request.get_response_sender()
    assert not p.is_cancelled() and not p.request.is_cancelled() and not sender.is_cancelled()
    p.cancel()
    assert p.is_cancelled() and p.request.is_cancelled() and sender.is_cancelled()


def test_on_cancel_runs_once_and_late_registrations_run_at_once() -> None:
    p = pending()
    calls: list[str] = []
    p.on_cancel(lambda: calls.append("early"))
    assert calls == []
    p.cancel()
    p.cancel()  # a second cancel does not call anyone again
    assert calls == ["early"]
    p.on_cancel(lambda: calls.append("late"))
    assert calls == ["early", "late"]


def test_a_failing_cancel_callback_does_not_stop_the_others() -> None:
    p = pending()
    calls: list[str] = []

    def broken() -> None:
        raise RuntimeError("boom")

    p.on_cancel(broken)
    p.on_cancel(lambda: calls.append("second"))
    p.cancel()
    assert calls == ["second"]


def response(value: int) -> pb_utils.InferenceResponse:
    out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
    return pb_utils.InferenceResponse(output_tensors=[out])


def test_responses_from_another_thread_arrive_all_and_in_order() -> None:
    # A burst of responses from a model thread, with the loop draining at the same time: the
    # coalesced wake-ups must never leave a response behind.
    count = 2000

    async def main() -> list[int]:
        responses = _Responses(asyncio.get_running_loop(), "m")

        def model() -> None:
            for i in range(count):
                responses.respond(response(i), i == count - 1)

        threading.Thread(target=model).start()
        seen = []
        while True:
            item, final = await asyncio.wait_for(responses.next(), timeout=10)
            seen.append(item["tensors"][0]["data"]["values"][0])
            assert item["parameters"]["triton_final_response"] == {"bool": final}
            if final:
                return seen

    assert asyncio.run(main()) == list(range(count))


def test_after_the_client_is_gone_responses_are_dropped() -> None:
    async def main() -> tuple[object, bool]:
        responses = _Responses(asyncio.get_running_loop(), "m")
        responses.client_gone()
        responses.gone = True
        responses.respond(response(1), True)  # late: dropped
        first = await asyncio.wait_for(responses.next(), timeout=5)
        assert not responses._items
        return first

    item, final = asyncio.run(main())
    assert item is _GONE and final


def test_a_response_that_cannot_be_encoded_fails_the_request_not_the_model_thread() -> None:
    # Encoding is the bridge's side of the boundary: its failure must reach the client as an
    # INTERNAL error, never raise into the model's thread (Pending.deliver's caller).
    def broken_encode(response: object, final: bool) -> dict:
        raise ValueError("cannot carry this")

    async def main() -> tuple[object, bool]:
        responses = _Responses(asyncio.get_running_loop(), "m")
        responses.encode = broken_encode
        raised: list[BaseException] = []

        def model() -> None:
            try:
                responses.respond(response(1), True)
            except BaseException as exc:  # noqa: BLE001 - what the test looks for
                raised.append(exc)

        thread = threading.Thread(target=model)
        thread.start()
        thread.join(10)
        assert raised == []
        return await asyncio.wait_for(responses.next(), timeout=5)

    item, final = asyncio.run(main())
    assert final
    assert isinstance(item, pb_utils.TritonError)
    assert item.code() == pb_utils.TritonError.INTERNAL
    assert "the response could not be encoded: ValueError('cannot carry this')" in item.message()


def _sender_thread(responses: _Responses, count: int) -> tuple[threading.Thread, list[int]]:
    """A model thread sending `count` non-final responses; the list holds how many went."""
    sent: list[int] = [0]

    def model() -> None:
        for i in range(count):
            responses.respond(response(i), False)
            sent[0] = i + 1

    thread = threading.Thread(target=model, daemon=True)
    thread.start()
    return thread, sent


def test_a_sender_ahead_of_its_client_waits_and_goes_on_as_the_client_reads() -> None:
    async def main() -> None:
        responses = _Responses(asyncio.get_running_loop(), "m")
        thread, sent = _sender_thread(responses, RESPONSES_AHEAD + 5)
        # Nobody reads: the sender stops at the bound (its next send waits for room).
        while sent[0] < RESPONSES_AHEAD:
            await asyncio.sleep(0.01)
        thread.join(0.2)
        assert thread.is_alive() and sent[0] == RESPONSES_AHEAD
        assert len(responses._items) == RESPONSES_AHEAD
        for _ in range(RESPONSES_AHEAD + 5):  # the client reads: every response arrives
            await asyncio.wait_for(responses.next(), timeout=10)
        await asyncio.to_thread(thread.join, 10)
        assert not thread.is_alive() and sent[0] == RESPONSES_AHEAD + 5

    asyncio.run(main())


def test_a_waiting_sender_is_let_go_when_the_client_leaves() -> None:
    async def main() -> None:
        responses = _Responses(asyncio.get_running_loop(), "m")
        thread, sent = _sender_thread(responses, RESPONSES_AHEAD + 100)
        while sent[0] < RESPONSES_AHEAD:
            await asyncio.sleep(0.01)
        responses.close()  # what generate() does once its client is gone
        await asyncio.to_thread(thread.join, 10)
        assert not thread.is_alive()
        assert len(responses._items) == RESPONSES_AHEAD  # the rest was dropped

    asyncio.run(main())


def test_a_final_and_a_response_on_the_loop_never_wait() -> None:
    # The loop answers early errors and cancellations itself: it must never block on its own
    # queue. A final response (a closing model fails what is open) lets a waiting sender go.
    async def main() -> None:
        responses = _Responses(asyncio.get_running_loop(), "m")
        for i in range(RESPONSES_AHEAD + 3):  # on the loop's thread: no wait
            responses.respond(response(i), False)
        thread, sent = _sender_thread(responses, 1)
        thread.join(0.2)
        assert thread.is_alive() and sent[0] == 0
        await asyncio.to_thread(responses.respond, response(-1), True)
        await asyncio.to_thread(thread.join, 10)
        assert not thread.is_alive() and sent[0] == 1

    asyncio.run(main())


def test_a_response_through_a_shared_gate_never_waits() -> None:
    # preserve_ordering hands responses over under a lock the loop may need (a cancelled
    # request is answered through it): waiting for one client there could wait for ever.
    async def main() -> None:
        responses = _Responses(asyncio.get_running_loop(), "m")

        def gate() -> None:
            with holding_a_shared_lock():
                for i in range(RESPONSES_AHEAD + 3):
                    responses.respond(response(i), False)

        thread = threading.Thread(target=gate, daemon=True)
        thread.start()
        await asyncio.to_thread(thread.join, 10)
        assert not thread.is_alive() and len(responses._items) == RESPONSES_AHEAD + 3

    asyncio.run(main())
