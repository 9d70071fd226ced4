"""Decoupled `async def execute`: one response per element of IN, `await asyncio.sleep` between.

Request parameters: `delay_ms` (the await before each response, default 0), `raise` (true:
raise after the first response instead of finishing), `started` and `gate` (file paths: write
`started` on entry, then await until `gate` exists before the first response, so a test can hold
several coroutines inside execute at once without timing anything).
"""

import asyncio
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist()
            sender = request.get_response_sender()
            await held_at_gate(params)
            for value in values:
                await asyncio.sleep(params.get("delay_ms", 0) / 1000.0)
                out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
                if params.get("raise"):
                    raise RuntimeError("async_repeat was asked to fail")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None


async def held_at_gate(params):
    if params.get("started"):
        with open(params["started"], "w") as f:
            f.write("started")
    if params.get("gate"):
        for _ in range(6000):  # at most 60 s: a test that never opens the gate fails, not hangs
            if os.path.exists(params["gate"]):
                return
            await asyncio.sleep(0.01)
