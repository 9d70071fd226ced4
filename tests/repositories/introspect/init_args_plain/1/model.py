"""INFO = JSON of the args dict given to initialize (paths made relative to the repository)."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

# <repository>/<model>/<version>/<this file>
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def relative(path):
    return os.path.relpath(os.path.realpath(path), REPOSITORY)


class TritonPythonModel:
    def initialize(self, args):
        info = {
            "keys": sorted(args),
            "types": {key: type(value).__name__ for key, value in sorted(args.items())},
            "model_repository_is_absolute": os.path.isabs(args["model_repository"]),
            "model_repository": relative(args["model_repository"]),
            "model_config": json.loads(args["model_config"]),
        }
        for key in (
            "model_name",
            "model_version",
            "model_instance_kind",
            "model_instance_name",
            "model_instance_device_id",
        ):
            info[key] = args[key]
        get_model_dir = getattr(pb_utils, "get_model_dir", None)
        info["get_model_dir"] = relative(get_model_dir()) if get_model_dir else None
        self.info = json.dumps(info, sort_keys=True).encode("utf-8")

    def execute(self, requests):
        responses = []
        for request in requests:
            # One copy per element of INPUT0: [batch, 1] when batched, [1] otherwise.
            shape = pb_utils.get_input_tensor_by_name(request, "INPUT0").shape()
            info = np.full(shape, self.info, dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", info)]))
        return responses
