"""Calls the model loading API named by request parameters and returns what happened.

Parameters: `op` = "load" | "unload" | "ready"; `target` = a model name; optional `config`
(a JSON config string for load), `file_model_py` (source text sent as files={"file:1/model.py":
...} with load), `version` (for ready). RESULT = "ok", "True"/"False" (ready), or
"<ExceptionType>: <message>" when the call raised.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            try:
                result = self._run(params)
            except Exception as exc:
                result = f"{type(exc).__name__}: {exc}"
            out = pb_utils.Tensor("RESULT", np.array([result.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses

    def _run(self, params):
        op, target = params["op"], params["target"]
        if op == "load":
            kwargs = {}
            if "config" in params:
                kwargs["config"] = params["config"]
            if "file_model_py" in params:
                kwargs["files"] = {"file:1/model.py": params["file_model_py"].encode()}
            pb_utils.load_model(target, **kwargs)
            return "ok"
        if op == "unload":
            pb_utils.unload_model(target)
            return "ok"
        if op == "ready":
            return str(pb_utils.is_model_ready(target, params.get("version", "")))
        raise ValueError(f"unknown op {op}")
