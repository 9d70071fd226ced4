"""ARGV = repr(sys.argv) as the model sees it, in `initialize` and in `execute` (one line each).

Triton's stub runs model.py in an interpreter of its own, so `sys.argv` is the stub's, never the
server's command line; models that parse arguments (argparse, `unittest.main`) see that.
"""

import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.at_initialize = repr(sys.argv)

    def execute(self, requests):
        text = f"{self.at_initialize}\n{sys.argv!r}"
        out = np.array([text.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGV", out)]) for _ in requests]
