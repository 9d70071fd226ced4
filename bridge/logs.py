"""Log lines in tritonserver's shape: `I1121 09:23:01.443324 8705 model.py:21] "message"`.

Users grep Triton logs by that shape; model lines from `pb_utils.Logger` keep the calling model
file's name and line, and are quoted as Triton quotes them.
"""

from __future__ import annotations

import logging
import os
import time

from model_repository_loader.pb_utils.logger import LOGGER_NAME


class TritonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
        micros = int((record.created % 1) * 1_000_000)
        message = record.getMessage()
        if record.name == LOGGER_NAME:
            message = f'"{message}"'
        # Triton has no debug letter: its verbose lines print as `I` [V].
        letter = "I" if record.levelno < logging.WARNING else record.levelname[0]
        line = (
            f"{letter}{stamp}.{micros:06d} {os.getpid()} "
            f"{record.filename}:{record.lineno}] {message}"
        )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(verbose: int) -> None:
    """Our lines at INFO (DEBUG with --log-verbose ≥ 1) on stderr, in Triton's shape."""
    handler = logging.StreamHandler()
    handler.setFormatter(TritonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose > 0 else logging.INFO)
