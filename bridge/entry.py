"""The process's entry (`dynamo-bridge`, `python -m bridge`): what must be settled before any
library is loaded, then the command line (cli.py).

gRPC's core reads GRPC_EXPERIMENTS once, when it is loaded by the first `import grpc`, and the
command line's own imports load it; so the server I/O choice (tuning.py `grpc_server_io`) is
made here, around that import.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Sequence

from .tuning import grpc_server_io


def _grpcio_version() -> str | None:
    try:
        return importlib.metadata.version("grpcio")
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    with grpc_server_io(os.environ, _grpcio_version()):
        from .cli import main as run  # loads grpc, which reads the variable now

    return run(argv)
