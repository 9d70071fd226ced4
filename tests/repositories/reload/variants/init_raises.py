"""A version of marked/1/model.py whose initialize() raises: the reload must fail and leave the
serving version in place."""

import triton_python_backend_utils as pb_utils  # noqa: F401

MARK = 99


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("reload test: initialize refuses")

    def execute(self, requests):
        return []
