"""One process on the nats request plane that makes Dynamo endpoint objects while responses
arrive (tests/e2e/test_nats_startup.py runs it; bridge/dynamo_endpoints.py says why).

It serves `<ns>.echo.generate` (a stream of 20 small items per request), keeps `--streams`
requests in flight from its own client, and makes `--calls` endpoint objects of new components
through `dynamo_endpoint()` with its watchdog at `--wedged-s`. Prints `made <n>` after each and
`done` at the end, then exits 0; a wedged call ends it with status 1 and the threads' stacks.
With `--bridge-threads` the runtime's threads are what the bridge sets (bridge/tuning.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import uvloop


async def serve_and_make(namespace: str, streams: int, calls: int) -> None:
    from dynamo.runtime import DistributedRuntime

    from bridge.dynamo_endpoints import dynamo_endpoint

    runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", "nats")
    served = dynamo_endpoint(runtime, f"{namespace}.echo.generate")

    async def generate(request: dict[str, Any], context: Any = None) -> AsyncIterator[dict]:
        for index in range(int(request["n"])):
            yield {"i": index}

    serving = asyncio.ensure_future(served.serve_endpoint(generate))
    client = await served.client()
    await asyncio.wait_for(client.wait_for_instances(), 30)

    async def keep_one_in_flight() -> None:
        while True:
            async for _ in await client.generate({"n": 20}):
                pass

    readers = [asyncio.ensure_future(keep_one_in_flight()) for _ in range(streams)]
    await asyncio.sleep(1.0)  # every stream under way
    for index in range(calls):
        dynamo_endpoint(runtime, f"{namespace}.c{index}.generate")
        print("made", index + 1, flush=True)
        await asyncio.sleep(0.01)
    print("done", flush=True)
    for task in (*readers, serving):
        task.cancel()
    os._exit(0)  # the runtime's threads need not wind down for this answer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--wedged-s", type=float, default=5.0)
    parser.add_argument("--bridge-threads", action="store_true")
    args = parser.parse_args()
    if args.bridge_threads:
        from bridge.tuning import runtime_threads

        runtime_threads(os.environ, "nats")
    import bridge.dynamo_endpoints

    bridge.dynamo_endpoints.WEDGED_S = args.wedged_s
    uvloop.run(serve_and_make(args.namespace, args.streams, args.calls))


if __name__ == "__main__":
    main()
