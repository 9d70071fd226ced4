"""Decoupled `async def execute`: one response per element of IN, `await asyncio.sleep` between.

Request parameters: `delay_ms` (the await before each response, default 0), `raise` (true:
raise after the first response instead of finishing).
"""

import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist()
            sender = request.get_response_sender()
            for value in values:
                await asyncio.sleep(params.get("delay_ms", 0) / 1000.0)
                out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
                if params.get("raise"):
                    raise RuntimeError("async_repeat was asked to fail")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
