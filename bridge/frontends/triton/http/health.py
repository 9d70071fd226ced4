"""`/v2/health/live`, `/v2/health/ready` and `/v2/models/<m>[/versions/<v>]/ready`.

As Triton 2.51's HTTP server [V]: 200 with an empty body when live / ready; a server that is
not ready is 400 with an empty body, a model (or version) that is not ready or not known is
400 `{"error":"Model version not ready"}`. These bodies are `text/plain`, as Triton sends them.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from .error_status import error_body, plain

NOT_READY = "Model version not ready"


async def live(request: Request) -> Response:
    return plain(b"", 200)


async def ready(request: Request) -> Response:
    if await request.app.state.service.server_ready():
        return plain(b"", 200)
    return plain(b"", 400)


async def model_ready(request: Request) -> Response:
    params = request.path_params
    service = request.app.state.service
    if await service.model_ready(params["model"], params.get("version", "")):
        return plain(b"", 200)
    return plain(error_body(NOT_READY), 400)
