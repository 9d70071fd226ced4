"""A separate process with its own Dynamo runtime that calls bridge endpoints for a test.

Run as `python -m tests.e2e.dynamo_caller` with the same DYN_DISCOVERY_BACKEND / DYN_FILE_KV as
the bridge under test. Commands come as pickles on stdin, one answer (a pickle) per command on
stdout: (ok, value) or (False, "<exception text>"). Commands:

- ("control", namespace, request, count): wait until `count` bridge processes serve the control
  endpoint, send `request` to each with `direct`; the answers, by instance id.
- ("call", path, request): `round_robin` the request to a model endpoint; every item.
- ("call_cancel", path, request, after): as "call", but stop the context once `after` items
  arrived; the items received until the stream ended.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
from typing import Any

from dynamo._core import Context
from dynamo.runtime import DistributedRuntime

WAIT_S = 30.0


async def control(rt: Any, namespace: str, request: dict, count: int) -> dict[int, list]:
    client = await rt.endpoint(f"{namespace}.bridge.control").client()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while len(client.instance_ids()) < count:
        if loop.time() > deadline:
            raise TimeoutError(f"{len(client.instance_ids())} control instances, not {count}")
        await asyncio.sleep(0.05)
    answers = {}
    for instance in client.instance_ids():
        stream = await client.direct(request, instance, annotated=False)
        answers[instance] = [item async for item in stream]
    return answers


async def call(rt: Any, path: str, request: dict, after: int | None = None) -> list:
    client = await rt.endpoint(path).client()
    await asyncio.wait_for(client.wait_for_instances(), WAIT_S)
    context = Context()
    stream = await client.round_robin(request, annotated=False, context=context)
    items = []
    async for item in stream:
        items.append(item)
        if after is not None and len(items) == after:
            context.stop_generating()
    return items


async def main() -> None:
    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "file", "tcp")
    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    while True:
        try:
            command = await loop.run_in_executor(None, pickle.load, stdin)
        except EOFError:
            break
        kind, *args = command
        try:
            if kind == "control":
                value: Any = await asyncio.wait_for(control(rt, *args), WAIT_S)
            elif kind == "call":
                value = await asyncio.wait_for(call(rt, *args), WAIT_S)
            elif kind == "call_cancel":
                value = await asyncio.wait_for(call(rt, *args), WAIT_S)
            else:
                raise ValueError(f"unknown command {kind!r}")
            answer = (True, value)
        except Exception as exc:
            answer = (False, f"{type(exc).__name__}: {exc}")
        pickle.dump(answer, stdout)
        stdout.flush()
    rt.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
