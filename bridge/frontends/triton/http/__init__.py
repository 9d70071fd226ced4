"""Triton's HTTP/REST protocol (KServe v2 + Triton's extensions) on the triton door.

`app.py` holds the route table; handlers are grouped by concern (`health.py`, `models.py`,
`infer.py`, ...), `tensors.py` turns JSON and binary tensors into the bridge form and back,
`error_status.py` maps Triton's error codes to HTTP statuses, `server.py` serves the app with
uvicorn inside the process's own asyncio loop.
"""
