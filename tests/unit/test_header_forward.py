"""Header forwarding's matching rules, in memory (bridge/frontends/triton/header_forward.py)."""

from __future__ import annotations

import pytest

from bridge.frontends.triton.door_error import DoorError
from bridge.frontends.triton.header_forward import HeaderForwarding, forward_into


def test_a_case_insensitive_search_unless_told_otherwise() -> None:
    forwarding = HeaderForwarding("tenant")
    headers = [("My-Tenant", "a"), ("TENANT", "b"), ("other", "c")]
    assert forwarding.parameters(headers) == {
        "My-Tenant": {"string": "a"},
        "TENANT": {"string": "b"},
    }
    strict = HeaderForwarding("(?-i)tenant")
    assert strict.parameters(headers) == {}
    assert strict.parameters([("x-tenant", b"bin\xff")]) == {"x-tenant": {"string": "bin\ufffd"}}


def test_reserved_names_are_refused() -> None:
    forwarding = HeaderForwarding(".*")
    for name in ("sequence_id", "priority", "triton_enable_empty_final_response"):
        with pytest.raises(DoorError, match=f"Header '{name}' is reserved for Triton usage"):
            forwarding.parameters([(name, "1")])


def test_headers_win_a_clash_and_a_bad_pattern_is_refused() -> None:
    body = {"parameters": {"tenant": {"string": "body"}, "n": {"int64": 1}}}
    forward_into(body, {"tenant": {"string": "header"}})
    assert body["parameters"] == {"tenant": {"string": "header"}, "n": {"int64": 1}}
    with pytest.raises(ValueError, match="header forward pattern"):
        HeaderForwarding("(")
