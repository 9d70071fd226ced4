"""Default-mode `async def execute`: awaits `delay_ms` (request parameter), returns OUT = IN * IN.

`return` (request parameter) "tuple" returns a tuple instead of a list, to see the return-value
check applied to coroutines. `started` and `gate` (file paths): write `started` on entry, then
await until `gate` exists, so a test can hold several coroutines inside execute at once.
"""

import asyncio
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        shape = "list"
        for request in requests:
            params = json.loads(request.parameters())
            shape = params.get("return", shape)
            await held_at_gate(params)
            await asyncio.sleep(params.get("delay_ms", 0) / 1000.0)
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = pb_utils.Tensor("OUT", (values * values).astype(np.int32))
            responses.append(pb_utils.InferenceResponse([out]))
        return tuple(responses) if shape == "tuple" else responses


async def held_at_gate(params):
    if params.get("started"):
        with open(params["started"], "w") as f:
            f.write("started")
    if params.get("gate"):
        for _ in range(6000):  # at most 60 s: a test that never opens the gate fails, not hangs
            if os.path.exists(params["gate"]):
                return
            await asyncio.sleep(0.01)
