"""Whether an in-process Dynamo frontend lists a model yet (its HTTP `/v1/models`).

A reload withdraws the old generation only once the new one is routable: discovery shows the
new instance, and the frontend lists the name. Dynamo 1.6 gives no event for the second, so the
frontend's own HTTP port is asked (`FrontendRole.confirm_listed`, given to the model manager).
"""

from __future__ import annotations

import asyncio
import json

# Between two asks: a listing follows the registration within milliseconds, and each ask is one
# loopback HTTP request.
POLL_S = 0.005


async def until_frontend_lists(port: int, name: str, timeout: float) -> bool:
    """Poll `http://127.0.0.1:<port>/v1/models` until it lists `name`; False after `timeout`."""
    loop = asyncio.get_running_loop()
    needle = b'"id":' + json.dumps(name).encode()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            body = await asyncio.wait_for(reader.read(), 1.0)
            writer.close()
            if needle in body.replace(b" ", b""):
                return True
        except (OSError, asyncio.TimeoutError):
            pass
        await asyncio.sleep(POLL_S)
    return False
