"""A Dynamo caller that routes on a model endpoint's instances (as a cross-worker BLS call does),
not on model cards: `python -m tests.e2e.roles_caller <namespace> <model> <report file>`.

It sends one small FP32 request after another to `echo`-like models through `client.generate`
until killed, and appends "ok" or "error" to the report file after each, so a test can wait for
traffic without timing anything. File discovery from DYN_FILE_KV, as the worker.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop
from dynamo.runtime import DistributedRuntime

from bridge.models.endpoint import component_name

REQUEST = {
    "model": "",
    "tensors": [
        {
            "metadata": {"name": "INPUT0", "data_type": "Float32", "shape": [1]},
            "data": {"data_type": "Float32", "values": [1.0]},
        }
    ],
}


async def main(namespace: str, model: str, report: str) -> None:
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    client = await runtime.endpoint(f"{namespace}.{component_name(model)}.generate").client()
    await client.wait_for_instances()
    request = {**REQUEST, "model": model}
    with open(report, "a", buffering=1) as out:
        while True:
            try:
                async for _ in await client.generate(request, annotated=False):
                    pass
                out.write("ok\n")
            except Exception:  # no instance left, or the worker went away: keep calling
                out.write("error\n")
                await asyncio.sleep(0.01)


if __name__ == "__main__":
    uvloop.run(main(*sys.argv[1:4]))
