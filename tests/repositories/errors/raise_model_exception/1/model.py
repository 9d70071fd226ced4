"""Raises pb_utils.TritonModelException directly in execute."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("raise_model_exception was asked to fail")
