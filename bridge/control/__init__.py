"""The control port (`--control-port`): Triton's model repository API over HTTP.

`port.py` serves the triton door's HTTP wire restricted to its repository and health routes;
the restricted groups it honours are bridge/restrictions.py's.
"""

from ..restrictions import MODEL_REPOSITORY, Restriction, parse_restricted_api
from .port import ControlPort

__all__ = ["MODEL_REPOSITORY", "ControlPort", "Restriction", "parse_restricted_api"]
