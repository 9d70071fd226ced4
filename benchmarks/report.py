"""Turning measured cells into the table, results.json and the plot."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

NA = "n/a"
# Ratios shown in the table, each of the bridge's p50 latency over another server's.
RATIOS: tuple[tuple[str, str], ...] = (("bridge", "echo"), ("bridge", "triton"))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def cell_ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """{"bridge/echo": {"p50_ms": …, "p99_ms": …, "rps": …, "p50_turns_median": …}, …}.

    `p50_turns_median` is the median over rounds of each round's p50 ratio (the servers take
    their turns back to back, so a burst of outside load hits both sides of one ratio). None
    where a side has no number.
    """
    out = {}
    for a, b in RATIOS:
        ra, rb = results.get(a) or {}, results.get(b) or {}
        ratios: dict[str, float | None] = {
            key: _ratio(ra.get(key), rb.get(key)) for key in ("p50_ms", "p99_ms", "rps")
        }
        turns = [
            x / y
            for x, y in zip(ra.get("turn_p50_ms") or [], rb.get("turn_p50_ms") or [], strict=False)
            if y
        ]
        ratios["p50_turns_median"] = statistics.median(turns) if turns else None
        out[f"{a}/{b}"] = ratios
    return out


def _num(value: float | None, digits: int = 2) -> str:
    if value is None:
        return NA
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.{digits}f}"


def format_server_cell(result: dict[str, Any] | None) -> str:
    """`p50 / p99 ms, req/s`, or n/a."""
    if not result or result.get("p50_ms") is None:
        return NA
    return f"{_num(result['p50_ms'])} / {_num(result['p99_ms'])}; {_num(result['rps'], 0)}"


def _errors(results: dict[str, dict[str, Any]]) -> str:
    parts = [f"{name} {r['errors']}" for name, r in results.items() if r and r.get("errors")]
    return ", ".join(parts) or "0"


def format_table(cells: Sequence[dict[str, Any]], servers: Sequence[str]) -> str:
    """A Markdown table: one row per cell, one column per server, then the p50 ratios."""
    ratio_names = [f"{a}/{b}" for a, b in RATIOS if a in servers and b in servers]
    header = (
        ["workload", "conc."]
        + [f"{s} p50 / p99 ms; req/s" for s in servers]
        + [f"{name.replace('/', ' ÷ ')} (p50)" for name in ratio_names]
        + ["errors"]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell in cells:
        results = cell["results"]
        row = [cell["workload"], str(cell["concurrency"])]
        row += [format_server_cell(results.get(s)) for s in servers]
        row += [_num(cell["ratios"][name]["p50_ms"]) for name in ratio_names]
        row.append(_errors(results))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def format_cell_line(cell: dict[str, Any], servers: Sequence[str]) -> str:
    """One cell as a few lines for the console, printed as soon as it is measured."""
    head = f"{cell['workload']} @ concurrency {cell['concurrency']}"
    lines = [head]
    for server in servers:
        result = cell["results"].get(server) or {}
        text = format_server_cell(result)
        if result.get("errors"):
            text += f"  ({result['errors']} errors, first: {result['first_error'][:120]})"
        lines.append(f"  {server:<7} p50 / p99 ms; req/s: {text}")
    for name, ratio in cell["ratios"].items():
        a, b = name.split("/")
        if a in servers and b in servers:
            lines.append(
                f"  {a} ÷ {b}: p50 {_num(ratio['p50_ms'])}, p99 {_num(ratio['p99_ms'])}, "
                f"median of rounds' p50 {_num(ratio.get('p50_turns_median'))}"
            )
    return "\n".join(lines)


def write_json(path: Path, results: dict[str, Any]) -> None:
    path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")


def write_plot(path: Path, cells: Sequence[dict[str, Any]], servers: Sequence[str]) -> str | None:
    """p50 latency and throughput per workload, one row per concurrency, as a PNG.

    Returns None when written, else why not (matplotlib is an optional `bench` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install '.[bench]'); no plot written"

    concurrencies = sorted({c["concurrency"] for c in cells})
    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    by_key = {(c["workload"], c["concurrency"]): c for c in cells}
    fig, axes = plt.subplots(
        len(concurrencies), 2, figsize=(13, 3.2 * len(concurrencies)), squeeze=False
    )
    width = 0.8 / max(len(servers), 1)
    for row, conc in enumerate(concurrencies):
        for col, (key, label) in enumerate((("p50_ms", "p50 latency, ms"), ("rps", "requests/s"))):
            ax = axes[row][col]
            for k, server in enumerate(servers):
                values = []
                for workload in workloads:
                    cell = by_key.get((workload, conc))
                    result = (cell or {}).get("results", {}).get(server) or {}
                    values.append(result.get(key) or 0.0)
                xs = [i + (k - (len(servers) - 1) / 2) * width for i in range(len(workloads))]
                ax.bar(xs, values, width, label=server)
            ax.set_yscale("log")
            ax.set_xticks(range(len(workloads)))
            ax.set_xticklabels(workloads, rotation=30, ha="right", fontsize=8)
            ax.set_title(f"{label} at concurrency {conc}", fontsize=10)
            ax.grid(axis="y", which="both", alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
