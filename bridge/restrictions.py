"""tritonserver's restricted protocol groups: `--http-restricted-api` and
`--grpc-restricted-protocol` (`<group>[,<group>...]:<key>=<value>`, repeatable).

The requests of a restricted group must carry the header (HTTP) or metadata (gRPC)
`<key>: <value>`; the groups are Triton's, the same for both protocols.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass

GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
MODEL_REPOSITORY = "model-repository"


@dataclass(frozen=True, slots=True)
class Restriction:
    """A restricted group: requests must carry header `header: value`."""

    header: str
    value: str

    def allows(self, headers: dict[str, str]) -> bool:
        """`headers`: the request's, names in lower case."""
        given = headers.get(self.header.lower())
        return given is not None and hmac.compare_digest(given.encode(), self.value.encode())


def parse_restrictions(
    specs: Iterable[str], flag: str, noun: str, format_hint: str
) -> dict[str, Restriction]:
    """A restriction flag's values as {group: Restriction}.

    `noun` ("api", "protocol") and `format_hint` word tritonserver's errors for that flag. Raises
    ValueError for a malformed value, an unknown group, or a group named in two values.
    """
    restrictions: dict[str, Restriction] = {}
    for spec in specs:
        groups, colon, setting = spec.partition(":")
        key, equals, value = setting.partition("=")
        if not (colon and equals and groups and key and value):
            raise ValueError(f"{flag} option format is '{format_hint}'. Got {spec}")
        for group in groups.split(","):
            if group not in GROUPS:
                raise ValueError(f"unknown restricted {noun} '{group}'")
            if group in restrictions:
                raise ValueError(
                    f"restricted {noun} '{group}' can not be specified in multiple config groups"
                )
            restrictions[group] = Restriction(key, value)
    return restrictions


def parse_restricted_api(specs: Iterable[str]) -> dict[str, Restriction]:
    """tritonserver's `--http-restricted-api` values."""
    return parse_restrictions(
        specs, "--http-restricted-api", "api", "<config name>:<setting>=<value>"
    )
