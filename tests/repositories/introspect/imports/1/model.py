"""INFO = JSON of how modules beside model.py and beside config.pbtxt were imported."""

import json
import os
import sys

# Three ways the Python backend lets a model reach its own files:
import helper_x  # beside model.py: the version directory is on sys.path
import model_level  # beside config.pbtxt: the model directory is on sys.path
import numpy as np
import triton_python_backend_utils as pb_utils

from . import helper_x as helper_relative  # model.py is imported as module "<version>.model"

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def module_info(module):
    return {"name": module.__name__, "value": module.VALUE, "describe": module.describe()}


def paths_in_repository():
    paths = []
    for entry in sys.path:
        real = os.path.realpath(entry)
        if real == REPOSITORY or real.startswith(REPOSITORY + os.sep):
            paths.append(os.path.relpath(real, REPOSITORY))
    return paths


class TritonPythonModel:
    def initialize(self, args):
        # A lazy import inside initialize: Triton keeps the model's folders importable.
        lazy = __import__(f"lazy_{args['model_name']}")
        info = {
            "lazy": module_info(lazy),
            "__name__": __name__,
            "__package__": __package__,
            "helper_x": module_info(helper_x),
            "helper_relative": module_info(helper_relative),
            "same_module_object": helper_x is helper_relative,
            "model_level": module_info(model_level),
            "sys_path_in_repository": paths_in_repository(),
        }
        self.info = json.dumps(info, sort_keys=True).encode("utf-8")

    def execute(self, requests):
        info = pb_utils.Tensor("INFO", np.array([self.info], dtype=np.object_))
        return [pb_utils.InferenceResponse([info]) for _ in requests]
