"""Errors the loader reports, worded as Triton words them."""

from __future__ import annotations

import traceback
from pathlib import Path

_LOADER_DIR = str(Path(__file__).resolve().parent)


class ModelLoadError(Exception):
    """A model (version) failed to load; str() is the reason Triton would report."""


def format_python_error(exc: BaseException) -> str:
    """`<Type>: <message>` plus the model's frames, as Triton renders a Python exception.

    Triton's stub lists the frames from the one that raised up to the model's entry point
    (`execute`, `initialize`, ...), innermost first, one `  <file>(<line>): <function>` a line.
    Our own frames (the loader calling into the model) are left out, as the stub's C++ ones are.
    """
    text = f"{type(exc).__name__}: {exc}"
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith(_LOADER_DIR)
    ]
    if not frames:
        return text
    lines = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return f"{text}\n\nAt:\n{lines}"
