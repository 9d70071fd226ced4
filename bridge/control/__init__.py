"""The HTTP control port (`--control-port`): Triton's model repository API over HTTP.

`server.py` is the whole of it today (h11 connections, Triton's routes, texts and codes); the
restricted groups it honours are bridge/restrictions.py's.
"""

from ..restrictions import MODEL_REPOSITORY, Restriction, parse_restricted_api
from .server import ControlServer

__all__ = ["MODEL_REPOSITORY", "ControlServer", "Restriction", "parse_restricted_api"]
