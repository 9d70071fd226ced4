"""The model status table printed at start-up, in the shape tritonserver prints it."""

from __future__ import annotations

from collections.abc import Iterable

from model_repository_loader.loader import ModelStatus


def format_status_table(statuses: Iterable[ModelStatus]) -> str:
    rows = [("Model", "Version", "Status")]
    for status in sorted(statuses, key=lambda s: s.name):
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
    return "\n".join(lines)
