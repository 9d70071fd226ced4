"""async_fetch: looks KEY up in a (simulated) remote key-value store; VALUE is what it holds.

`execute` is a coroutine: while one fetch awaits its I/O (here `asyncio.sleep`), the model's
event loop runs the others, so N requests in flight at once finish in about one fetch time
instead of N. (Triton waits for one default-mode `execute` coroutine before starting the next
on an instance; the dynamic batcher in config.pbtxt puts requests that arrive together into one
call, whose fetches are gathered.) Real models await an HTTP client, a database driver or a BLS
`async_exec` here.
A key the store does not hold answers "<missing>".
"""

import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils

STORE = {"apple": "red", "banana": "yellow", "cherry": "dark red"}


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.fetch_seconds = int(config["parameters"]["fetch_ms"]["string_value"]) / 1000.0

    async def fetch(self, key):
        await asyncio.sleep(self.fetch_seconds)  # the network round trip
        return STORE.get(key, "<missing>")

    async def answer(self, request):
        keys = pb_utils.get_input_tensor_by_name(request, "KEY").as_numpy()  # [batch, 1]
        values = await asyncio.gather(*(self.fetch(k.decode("utf-8")) for k in keys.flat))
        out = np.array([v.encode("utf-8") for v in values], dtype=np.object_).reshape(keys.shape)
        return pb_utils.InferenceResponse([pb_utils.Tensor("VALUE", out)])

    async def execute(self, requests):
        # Every request of the batch (and every key of each request) is fetched concurrently.
        return list(await asyncio.gather(*(self.answer(r) for r in requests)))
