"""`POST /v2/models/<m>[/versions/<v>]/infer` (placeholder until the tensors land)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from model_repository_loader.pb_utils.errors import ErrorCode

from ..status import DoorError


async def infer(request: Request) -> Response:
    raise DoorError(ErrorCode.UNSUPPORTED, "inference over HTTP is not served yet")
