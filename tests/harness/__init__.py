"""Reusable pytest plumbing: free ports, the real Triton oracle, the dynamo-bridge process."""

from .bridge_server import BridgeServer
from .oracle import (
    OracleEnv,
    OracleUnavailable,
    TritonOracle,
    find_oracle,
    in_ci,
    oracle_python,
    oracle_unavailable_reason,
    require_oracle,
)
from .ports import free_port, free_ports, port_is_open, wait_for_port
from .process import ServerProcess, stop_process_group

__all__ = [
    "BridgeServer",
    "OracleEnv",
    "OracleUnavailable",
    "ServerProcess",
    "TritonOracle",
    "find_oracle",
    "free_port",
    "free_ports",
    "in_ci",
    "oracle_python",
    "oracle_unavailable_reason",
    "port_is_open",
    "require_oracle",
    "stop_process_group",
    "wait_for_port",
]
