"""Raises ValueError from a helper called by execute (a two-frame traceback)."""

import triton_python_backend_utils as pb_utils


def check(value):
    raise ValueError(f"raise_in_execute refuses {value}")


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            check(int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0]))
        return []
