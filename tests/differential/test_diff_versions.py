"""Model versions (introspect/versioned: versions 1, 2, 3; policy latest 2 → Triton serves 2, 3).

A request without a version is answered by the newest version on both. Dynamo's request to the
worker carries no version, so a version-specific request is the newest version's answer on the
bridge (difference `model_version_ignored`); these tests pin exactly that. The triton door
sends the version to the worker: there every answer is Triton's.
"""

from __future__ import annotations

import pytest

from tests.differential.support import (
    TRITON_DOOR,
    Failure,
    Pair,
    both,
    expected_bridge_response,
    int32_input,
    summarize,
)

pytestmark = pytest.mark.oracle

UNKNOWN_VERSION_1 = Failure(
    "StatusCode.NOT_FOUND", "Request for unknown model: 'versioned' version 1 is not found"
)


def infer(version: str):
    return lambda c: c.infer("versioned", [int32_input([1])], model_version=version)


@pytest.mark.parametrize("version", ["", "3"], ids=["default", "newest"])
def test_newest_version_answers(introspect: Pair, version: str):
    triton, bridge = both(introspect, infer(version))
    assert triton.as_numpy("VERSION").tolist() == [3]
    assert triton.as_numpy("TAG")[0] == b"versioned file v3"
    assert summarize(bridge) == expected_bridge_response(triton)  # response_model_version


def test_older_served_version_is_answered_by_the_newest(introspect: Pair):
    triton_v2, bridge_v2 = both(introspect, infer("2"))
    assert triton_v2.as_numpy("VERSION").tolist() == [2]
    triton_newest, _ = both(introspect, infer(""))
    expected = triton_v2 if TRITON_DOOR else triton_newest  # model_version_ignored
    assert summarize(bridge_v2) == expected_bridge_response(expected)


def test_version_outside_the_policy_is_answered_by_the_newest(introspect: Pair):
    triton, bridge = both(introspect, infer("1"))
    assert triton == UNKNOWN_VERSION_1
    if TRITON_DOOR:
        assert bridge == triton
        return
    triton_newest, _ = both(introspect, infer(""))
    assert summarize(bridge) == expected_bridge_response(triton_newest)  # model_version_ignored


def test_model_ready_per_version(introspect: Pair):
    versions = ["", "1", "2", "3"]
    triton, bridge = both(
        introspect, lambda c: [c.is_model_ready("versioned", v) for v in versions]
    )
    assert triton == [True, False, True, True]
    assert bridge == (triton if TRITON_DOOR else [True, True, True, True])  # model_version_ignored


def test_model_config_of_a_version_outside_the_policy(introspect: Pair):
    triton, bridge = both(introspect, lambda c: c.get_model_config("versioned", "1", as_json=True))
    assert triton == UNKNOWN_VERSION_1
    newest, _ = both(introspect, lambda c: c.get_model_config("versioned", as_json=True))
    assert bridge == (triton if TRITON_DOOR else newest)  # model_version_ignored


def test_metadata_versions(introspect: Pair):
    triton, bridge = both(introspect, lambda c: c.get_model_metadata("versioned", as_json=True))
    assert triton["versions"] == ["2", "3"]
    assert bridge["versions"] == (triton["versions"] if TRITON_DOOR else ["1"])  # metadata_versions
