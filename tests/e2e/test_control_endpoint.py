"""The bridge control endpoint and the bridge form, called from another process with its own
Dynamo runtime (docs/worker_protocol.md §1 and §2): a bridge (embedded default) on
tests/repositories/cluster_b with `file` discovery, and tests/e2e/dynamo_caller.py as the caller."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tests.e2e.cluster_support import DynamoCaller, file_discovery_env, start_bridge
from tests.harness.repositories import materialize


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("control")
    env = file_discovery_env(folder / "kv")
    server = start_bridge(materialize("cluster_b", folder), env, folder / "bridge.log")
    caller = DynamoCaller(env, folder / "caller.log")
    try:
        yield server, caller
    finally:
        caller.close()
        server.stop()


@pytest.fixture(scope="module")
def index(cluster):
    _, caller = cluster
    answers = caller.control({"op": "index"})
    assert len(answers) == 1
    (items,) = answers.values()
    assert len(items) == 1
    return items[0]


def entry(index, name):
    return next(m for m in index["models"] if m["name"] == name)


def raw(name, data_type, shape, values: bytes):
    return {
        "metadata": {"name": name, "data_type": data_type, "shape": shape},
        "data": {"data_type": data_type, "values": values},
    }


def f32(values):
    return np.array(values, "<f4").tobytes()


def test_index_lists_every_model_with_its_endpoint_and_config(cluster, index):
    server, _ = cluster
    host, pid = index["worker"].rsplit(":", 1)
    assert int(pid) == server.process.pid
    names = [m["name"] for m in index["models"]]
    assert names == sorted(names)
    assert {"add_sub", "broken", "versioned", "repeat_dec"} <= set(names)
    add_sub = entry(index, "add_sub")
    assert add_sub["ready"] is True and add_sub["reason"] == ""
    assert add_sub["versions"] == ["1"]
    assert add_sub["bridge_form"] == 1
    assert add_sub["endpoint"].startswith("dynamo_bridge.add_sub-")
    assert add_sub["endpoint"].endswith(".generate")
    config = mc.ModelConfig.FromString(add_sub["config"])
    assert config.name == "add_sub" and [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert entry(index, "versioned")["versions"] == ["1", "2"]


def test_index_lists_a_model_that_failed_to_load(index):
    broken = entry(index, "broken")
    assert broken["ready"] is False
    assert "broken on purpose" in broken["reason"]
    assert broken["endpoint"] == "" and broken["config"] == b""


def test_an_unknown_op_is_an_invalid_arg_answer(cluster):
    _, caller = cluster
    (items,) = caller.control({"op": "explode"}).values()
    assert items[0]["error"]["code"] == "INVALID_ARG"
    assert "explode" in items[0]["error"]["message"]


def test_a_bridge_form_request_gets_raw_outputs(cluster, index):
    _, caller = cluster
    items = caller.call(
        entry(index, "add_sub")["endpoint"],
        {
            "bridge_form": 1,
            "tensors": [
                raw("INPUT0", "Float32", [4], f32([1, 2, 3, 4])),
                raw("INPUT1", "Float32", [4], f32([1, 1, 1, 1])),
            ],
            "outputs": [{"name": "OUTPUT0"}],
        },
    )
    assert len(items) == 1
    (item,) = items
    assert item["final"] is True and item["model_version"] == "1"
    (tensor,) = item["tensors"]
    assert tensor["metadata"] == {"name": "OUTPUT0", "data_type": "Float32", "shape": [4]}
    assert tensor["data"]["values"] == f32([2, 3, 4, 5])


def test_bytes_travel_length_prefixed(cluster, index):
    _, caller = cluster
    data = b"".join(struct.pack("<I", len(b)) + b for b in [b"a", b"", b"xyz"])
    (item,) = caller.call(
        entry(index, "identity_bytes")["endpoint"],
        {"bridge_form": 1, "tensors": [raw("INPUT0", "Bytes", [1, 3], data)]},
    )
    assert item["tensors"][0]["data"]["values"] == data
    assert item["tensors"][0]["metadata"]["shape"] == [1, 3]


@pytest.mark.parametrize(("version", "factor"), [("1", 1), ("2", 2), ("", 2)])
def test_model_version_selects_the_version_and_is_answered(cluster, index, version, factor):
    _, caller = cluster
    request = {"bridge_form": 1, "tensors": [raw("INPUT0", "Float32", [4], f32([1, 2, 3, 4]))]}
    if version:
        request["model_version"] = version
    (item,) = caller.call(entry(index, "versioned")["endpoint"], request)
    assert item["model_version"] == (version or "2")
    assert item["tensors"][0]["data"]["values"] == f32([factor * v for v in (1, 2, 3, 4)])


def test_an_unknown_version_is_a_rejected_not_found_item(cluster, index):
    _, caller = cluster
    request = {
        "bridge_form": 1,
        "model_version": "7",
        "tensors": [raw("INPUT0", "Float32", [4], f32([1, 2, 3, 4]))],
    }
    assert caller.call(entry(index, "versioned")["endpoint"], request) == [
        {
            "error": {
                "code": "NOT_FOUND",
                "message": "Request for unknown model: 'versioned' version 7 is not found",
            },
            "final": True,
            "rejected": True,
        }
    ]


def test_broken_raw_contents_are_a_rejected_invalid_arg_item(cluster, index):
    _, caller = cluster
    request = {"bridge_form": 1, "tensors": [raw("INPUT0", "Float32", [4], f32([1, 2]))]}
    (item,) = caller.call(entry(index, "versioned")["endpoint"], request)
    assert item["error"] == {
        "code": "INVALID_ARG",
        "message": "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' "
        "for model 'versioned'. Expected 16, got 8",
    }
    assert item["final"] is True and item["rejected"] is True


def test_a_model_error_is_an_item_and_not_rejected(cluster, index):
    _, caller = cluster
    request = {"bridge_form": 1, "tensors": [raw("INPUT0", "Float32", [4], f32([1, 2, 3, 4]))]}
    (item,) = caller.call(entry(index, "raiser")["endpoint"], request)
    assert item["error"]["code"] == "INTERNAL"
    assert "raiser refuses" in item["error"]["message"]
    assert item["final"] is True and "rejected" not in item


def test_decoupled_answers_end_with_the_flag_only_final(cluster, index):
    _, caller = cluster
    request = {"bridge_form": 1, "tensors": [raw("IN", "Int32", [1], struct.pack("<i", 2))]}
    items = caller.call(entry(index, "repeat_dec")["endpoint"], request)
    assert [i["tensors"][0]["data"]["values"] for i in items[:2]] == [
        struct.pack("<i", 0),
        struct.pack("<i", 1),
    ]
    assert [i["final"] for i in items[:2]] == [False, False]
    assert items[2] == {
        "model": "repeat_dec",
        "model_version": "1",
        "tensors": [],
        "final": True,
        "empty": True,
    }


def test_the_stream_goes_on_after_an_error_that_is_not_final(cluster, index):
    _, caller = cluster
    request = {"bridge_form": 1, "tensors": [raw("IN", "Int32", [1], struct.pack("<i", -1))]}
    items = caller.call(entry(index, "repeat_dec")["endpoint"], request)
    assert items[0] == {
        "error": {"code": "INTERNAL", "message": "repeat_dec got a negative count"},
        "final": False,
    }
    assert items[1]["final"] is True and items[1]["empty"] is True


def test_stopping_the_context_cancels_the_request(cluster, index):
    _, caller = cluster
    request = {
        "bridge_form": 1,
        "tensors": [raw("IN", "Int32", [1], struct.pack("<i", 400))],
        "parameters": {"delay_ms": {"int64": 20}},
    }
    items = caller.call_cancel(entry(index, "repeat_dec")["endpoint"], request, after=2)
    # The model stops at its next is_cancelled() check; nothing close to 400 answers arrive.
    assert 2 <= len(items) < 100
