"""What bridge processes say to each other (bridge/cluster/protocol.py, docs/worker_protocol.md):
the rows both sides share come back as they went, a malformed row reads as empty instead of
spoiling the answer, the door sums the statistics rows as Triton's fields, and the error item
carries Triton's code by name both ways (the control answers and the bridge-form responses)."""

from __future__ import annotations

from bridge.cluster.protocol import (
    IndexAnswer,
    IndexRow,
    Op,
    StatsRow,
    control_path,
    control_request,
    error_answer,
    load_request,
    read_error,
)
from bridge.codec import bridge_error, decode_bridge_item
from bridge.frontends.triton.door_error import DoorError
from bridge.frontends.triton.service import statistics_response
from model_repository_loader.pb_utils import TritonError
from model_repository_loader.pb_utils.errors import ErrorCode


def test_requests_are_plain_dicts_of_plain_strings() -> None:
    """msgpack on the request plane sends a str; an enum member must not reach it."""
    assert control_path("ns") == "ns.bridge.control"
    request = control_request(Op.INDEX)
    assert request == {"op": "index"} and type(request["op"]) is str
    load = load_request("m", "{}", {"file:1/model.py": b"x"})
    assert load == {"op": "load", "name": "m", "config": "{}", "files": {"file:1/model.py": b"x"}}


def test_an_index_answer_comes_back_as_it_went() -> None:
    rows = (
        IndexRow("a", ("1", "2"), True, "", "ns.a-1.generate", b"\x0a\x01a"),
        IndexRow("b", ("1",), False, "failed to load 'b'"),
    )
    wire = IndexAnswer("host:1", rows).to_wire()
    assert wire["models"][0]["bridge_form"] == 1
    assert IndexAnswer.from_wire(wire) == IndexAnswer("host:1", rows)
    assert [row.takes_requests for row in rows] == [True, False]


def test_a_malformed_index_row_reads_as_empty() -> None:
    assert IndexRow.from_wire("not a row") == IndexRow("", bridge_form=0)
    row = IndexRow.from_wire({"name": "a", "ready": 1, "versions": [1], "config": None})
    assert row == IndexRow("a", ("1",), True, bridge_form=0)
    assert IndexAnswer.from_wire(None) == IndexAnswer("")


def test_statistics_rows_sum_over_workers_as_triton_keeps_them() -> None:
    row = StatsRow(
        "m",
        "1",
        last_inference=5,
        inference_count=2,
        execution_count=1,
        inference={"success": (2, 300), "queue": (2, 40)},
        batches=(),
    )
    wire = row.to_wire()
    assert wire["inference_stats"] == {"success": [2, 300], "queue": [2, 40]}
    assert StatsRow.from_wire(wire) == row
    other = StatsRow.from_wire({**wire, "last_inference": 9})
    stats = statistics_response([row, other]).model_stats[0]
    assert (stats.name, stats.version, stats.last_inference) == ("m", "1", 9)
    assert (stats.inference_count, stats.inference_stats.success.ns) == (4, 600)
    assert stats.inference_stats.fail.ns == 0 and stats.inference_stats.HasField("fail")


def test_the_error_item_carries_the_code_by_name() -> None:
    answer = error_answer(ErrorCode.UNAVAILABLE, "no worker")
    assert answer == {"error": {"code": "UNAVAILABLE", "message": "no worker"}}
    assert read_error(answer["error"]) == (ErrorCode.UNAVAILABLE, "no worker")
    assert read_error({"code": "NO_SUCH_CODE", "message": "m"}) == (ErrorCode.INTERNAL, "m")
    code, text = read_error("oops")
    assert code == ErrorCode.INTERNAL and "malformed error" in text
    error = DoorError.from_item(answer["error"])
    assert (error.code, error.message) == (ErrorCode.UNAVAILABLE, "no worker")


def test_a_bridge_form_error_response_uses_the_same_item() -> None:
    item = bridge_error(TritonError("bad input", TritonError.INVALID_ARG), final=True)
    assert item["error"] == {"code": "INVALID_ARG", "message": "bad input"}
    response, final, rejected = decode_bridge_item(item)
    assert response is not None and final and not rejected
    assert response.error().code() == ErrorCode.INVALID_ARG
    assert response.error().message() == "bad input"
