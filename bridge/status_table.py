"""The model status table printed at start-up, in the shape tritonserver prints it.

When a model failed and the server goes on serving, a note under the table says what Triton's
strict readiness would answer, because Dynamo's frontend answers gRPC ServerReady true anyway.
"""

from __future__ import annotations

from collections.abc import Iterable

from model_repository_loader.loader import ModelStatus


def format_status_table(statuses: Iterable[ModelStatus], serving: bool = True) -> str:
    """The table; `serving` = the server goes on serving with failed models (else it exits)."""
    statuses = sorted(statuses, key=lambda s: s.name)
    rows = [("Model", "Version", "Status")]
    for status in statuses:
        if status.ready:
            rows += [(status.name, str(v), "READY") for v in status.versions]
        else:
            # Unlike Triton, a model that failed before any version (a bad config.pbtxt) is
            # listed too, with "-". The reason's first line; the full text is logged above.
            reason = status.reason.strip().splitlines()[0] if status.reason else ""
            version = ",".join(map(str, status.versions)) or "-"
            rows.append((status.name, version, f"UNAVAILABLE: {reason}"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    lines = [rule]
    for i, row in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            lines.append(rule)
    lines.append(rule)
    failed = [status.name for status in statuses if not status.ready]
    if failed and serving:
        lines.append(readiness_note(failed))
    return "\n".join(lines)


def readiness_note(failed: list[str]) -> str:
    """Under the table: Triton would say "not ready" here; the frontend will not."""
    return "\n".join(
        [
            f"Not ready: {', '.join(failed)}. Triton's strict readiness (its default) "
            "reports this server not ready (ServerReady false) until every model is ready, as "
            "the triton door does.",
            "Dynamo's frontend (--frontend dynamo) answers ServerReady true regardless: health "
            "checks there should ask ModelReady per model, or GET /v2/health/ready on the "
            "metrics port (400 while not ready).",
        ]
    )
