"""Default-mode `async def execute`: awaits `delay_ms` (request parameter), returns OUT = IN * IN.

`return` (request parameter) "tuple" returns a tuple instead of a list, to see the return-value
check applied to coroutines.
"""

import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        shape = "list"
        for request in requests:
            params = json.loads(request.parameters())
            shape = params.get("return", shape)
            await asyncio.sleep(params.get("delay_ms", 0) / 1000.0)
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = pb_utils.Tensor("OUT", (values * values).astype(np.int32))
            responses.append(pb_utils.InferenceResponse([out]))
        return tuple(responses) if shape == "tuple" else responses
