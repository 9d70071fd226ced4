"""Reusable pytest plumbing: free ports, the real Triton oracle, the dynamo-bridge process."""

from .bridge_server import BridgeServer
from .oracle import (
    OracleUnavailable,
    TritonOracle,
    find_oracle,
    oracle_python,
    oracle_unavailable_reason,
)
from .ports import free_port, free_ports, port_is_open, wait_for_port

__all__ = [
    "BridgeServer",
    "OracleUnavailable",
    "TritonOracle",
    "find_oracle",
    "free_port",
    "free_ports",
    "oracle_python",
    "oracle_unavailable_reason",
    "port_is_open",
    "wait_for_port",
]
