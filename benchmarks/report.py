"""Turning measured cells into the table, results.json and the plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .servers import FLOORS
from .spread import format_spread, number, paired, spread

NA = "n/a"
# Ratios shown, each of the first server's figure over the second's. bridge2 is a second copy
# of the bridge (the A/A pair): its ratio to bridge is what two runs of the same code differ
# by on this machine in this run, the resolution every other ratio is read against.
RATIOS: tuple[tuple[str, str], ...] = (
    ("bridge", "echo"),
    ("bridge", "triton"),
    ("bridge2", "bridge"),
    ("door", "triton"),
    ("door_split", "triton"),
    *((floor, "triton") for floor in FLOORS),
    ("door_sync", "triton"),
    # The lab's synchronous door against the real one: what the event-loop machinery costs.
    ("door_sync", "door"),
)
_FIGURES = (("p50_ms", "turn_p50_ms"), ("p99_ms", "turn_p99_ms"), ("rps", "turn_rps"))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def cell_ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{"bridge/echo": {"p50_ms": …, "p99_ms": …, "rps": …, "rounds": {"p50_ms": spread, …},
    "p50_turns_median": …}, …}.

    The pooled ratios are of the figures over all rounds. `rounds` has, per figure, the spread
    (median, min, max) of the per-round ratios: the servers take their turns back to back, so
    a burst of outside load hits both sides of one round's ratio. None where a side has no
    number.
    """
    out = {}
    for a, b in RATIOS:
        ra, rb = results.get(a) or {}, results.get(b) or {}
        ratios: dict[str, Any] = {key: _ratio(ra.get(key), rb.get(key)) for key, _ in _FIGURES}
        ratios["rounds"] = {
            key: spread(paired(ra.get(turns) or [], rb.get(turns) or [])) for key, turns in _FIGURES
        }
        p50_rounds = ratios["rounds"]["p50_ms"]
        ratios["p50_turns_median"] = p50_rounds["median"] if p50_rounds else None
        out[f"{a}/{b}"] = ratios
    return out


_num = number


def format_server_cell(result: dict[str, Any] | None) -> str:
    """`p50 / p99 ms, req/s`, or n/a."""
    if not result or result.get("p50_ms") is None:
        return NA
    return f"{_num(result['p50_ms'])} / {_num(result['p99_ms'])}; {_num(result['rps'], 0)}"


def _errors(results: dict[str, dict[str, Any]]) -> str:
    parts = [f"{name} {r['errors']}" for name, r in results.items() if r and r.get("errors")]
    return ", ".join(parts) or "0"


def load_label(cell: dict[str, Any]) -> str:
    """A closed-loop cell's concurrency ("8"), or an open-loop cell's arrival rate ("200/s")."""
    if cell.get("rate") is not None:
        return f"{cell['rate']:g}/s"
    return str(cell["concurrency"])


def _client_cpu(results: dict[str, dict[str, Any]]) -> str:
    # The client's CPU per request while it loaded the bridge (the server every ratio has).
    for name in ("bridge", "echo", "triton", "bridge2"):
        value = (results.get(name) or {}).get("client_cpu_ms")
        if value is not None:
            return _num(value, 3)
    return NA


def format_table(cells: Sequence[dict[str, Any]], servers: Sequence[str]) -> str:
    """A Markdown table: one row per cell, one column per server, then the p50 ratios (the
    median over rounds of the per-round ratio, with its range), the client's CPU per request
    and the errors."""
    ratio_names = [f"{a}/{b}" for a, b in RATIOS if a in servers and b in servers]
    header = (
        ["workload", "load"]
        + [f"{s} p50 / p99 ms; req/s" for s in servers]
        + [f"{name.replace('/', ' ÷ ')} p50, median [range] of rounds" for name in ratio_names]
        + ["client CPU ms/req", "errors"]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell in cells:
        results = cell["results"]
        row = [cell["workload"], load_label(cell)]
        row += [format_server_cell(results.get(s)) for s in servers]
        row += [format_spread(cell["ratios"][name]["rounds"]["p50_ms"]) for name in ratio_names]
        row += [_client_cpu(results), _errors(results)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def format_cell_line(cell: dict[str, Any], servers: Sequence[str]) -> str:
    """One cell as a few lines for the console, printed as soon as it is measured."""
    if cell.get("rate") is not None:
        head = f"{cell['workload']} @ {load_label(cell)} (open loop)"
    else:
        head = f"{cell['workload']} @ concurrency {cell['concurrency']}"
    lines = [head]
    for server in servers:
        result = cell["results"].get(server) or {}
        text = format_server_cell(result)
        if result.get("client_cpu_ms") is not None:
            text += f"  (client CPU {_num(result['client_cpu_ms'], 3)} ms/req)"
        if result.get("errors"):
            text += f"  ({result['errors']} errors, first: {result['first_error'][:120]})"
        lines.append(f"  {server:<7} p50 / p99 ms; req/s: {text}")
    for name, ratio in cell["ratios"].items():
        a, b = name.split("/")
        if a in servers and b in servers:
            rounds = ratio["rounds"]
            lines.append(
                f"  {a} ÷ {b}: p50 {_num(ratio['p50_ms'])}, p99 {_num(ratio['p99_ms'])}; "
                f"per round p50 {format_spread(rounds['p50_ms'])}, "
                f"p99 {format_spread(rounds['p99_ms'])}"
            )
    return "\n".join(lines)


def write_json(path: Path, results: dict[str, Any]) -> None:
    path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")


def write_plot(path: Path, cells: Sequence[dict[str, Any]], servers: Sequence[str]) -> str | None:
    """p50 latency and throughput per workload, one row per load (concurrency or rate), as a PNG.

    Returns None when written, else why not (matplotlib is an optional `bench` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install '.[bench]'); no plot written"

    loads = list(dict.fromkeys(load_label(c) for c in cells))
    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    by_key = {(c["workload"], load_label(c)): c for c in cells}
    fig, axes = plt.subplots(len(loads), 2, figsize=(13, 3.2 * len(loads)), squeeze=False)
    width = 0.8 / max(len(servers), 1)
    for row, load in enumerate(loads):
        for col, (key, label) in enumerate((("p50_ms", "p50 latency, ms"), ("rps", "requests/s"))):
            ax = axes[row][col]
            for k, server in enumerate(servers):
                values = []
                for workload in workloads:
                    cell = by_key.get((workload, load))
                    result = (cell or {}).get("results", {}).get(server) or {}
                    values.append(result.get(key) or 0.0)
                xs = [i + (k - (len(servers) - 1) / 2) * width for i in range(len(workloads))]
                ax.bar(xs, values, width, label=server)
            ax.set_yscale("log")
            ax.set_xticks(range(len(workloads)))
            ax.set_xticklabels(workloads, rotation=30, ha="right", fontsize=8)
            ax.set_title(f"{label} at load {load}", fontsize=10)
            ax.grid(axis="y", which="both", alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


# Issue 13's targets for the triton door against real Triton in the same run: (workload,
# concurrency, figure, {server: (comparison, bound)}). Latency rows compare p50 (the door's
# over Triton's: at most the bound); throughput rows compare requests/s (at least the bound).
DOOR_TARGETS: tuple[tuple[str, int, str, dict[str, tuple[str, float]]], ...] = (
    ("fp32_4", 1, "p50_ms", {"door": ("<=", 1.3), "door_split": ("<=", 2.0)}),
    ("fp32_100k", 1, "p50_ms", {"door": ("<=", 1.0), "door_split": ("<=", 1.5)}),
    ("fp32_1m", 1, "p50_ms", {"door": ("<=", 1.0), "door_split": ("<=", 1.5)}),
    ("add_sub", 32, "rps", {"door": (">=", 0.8)}),
    ("fp32_100k", 32, "rps", {"door": (">=", 1.0)}),
    ("stream_100_shared", 32, "rps", {"door": (">=", 1.0)}),
)
_FIGURE_LABEL = {"p50_ms": "p50", "rps": "throughput"}


def _round_ratio(cell: dict[str, Any], server: str, figure: str) -> dict[str, Any] | None:
    """The spread over rounds of `server` ÷ Triton's `figure` in `cell`, if measured."""
    rounds = cell["ratios"].get(f"{server}/triton", {}).get("rounds", {})
    ratio: dict[str, Any] | None = rounds.get(figure)
    return ratio


def _door_cell(
    cell: dict[str, Any] | None, server: str, figure: str, target: tuple[str, float]
) -> str:
    if cell is None:
        return NA
    ratio = _round_ratio(cell, server, figure)
    if ratio is None:
        return NA
    comparison, bound = target
    met = ratio["median"] <= bound if comparison == "<=" else ratio["median"] >= bound
    return f"{format_spread(ratio)} ({comparison} {bound:g}: {'met' if met else 'NOT met'})"


def format_door_table(cells: Sequence[dict[str, Any]]) -> str:
    """Issue 13's table: the door ÷ Triton per target row, embedded and split, as the median
    [range] over rounds of the per-round ratio, with the target and whether the median meets
    it. `n/a` where the run did not measure the cell."""
    by_key = {(c["workload"], c["concurrency"]): c for c in cells if c.get("rate") is None}
    lines = [
        "| workload | embedded default, `--frontend triton` | frontend + 1 worker process, tcp |",
        "|---|---|---|",
    ]
    for workload, concurrency, figure, targets in DOOR_TARGETS:
        cell = by_key.get((workload, concurrency))
        row = [f"{workload}, c={concurrency} {_FIGURE_LABEL[figure]}"]
        for server in ("door", "door_split"):
            target = targets.get(server)
            row.append(_door_cell(cell, server, figure, target) if target else "—")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def format_against_triton(cells: Sequence[dict[str, Any]], servers: Sequence[str]) -> str:
    """Every server ÷ Triton per cell, as the median [range] over rounds of the per-round
    ratio: p50 at concurrency 1 (lower is better), requests/s above it (higher is better)."""
    others = [s for s in servers if s != "triton"]
    lines = ["| cell | " + " | ".join(others) + " |", "|---|" + "---|" * len(others)]
    for cell in cells:
        if cell.get("rate") is not None:
            continue
        figure = "p50_ms" if cell["concurrency"] == 1 else "rps"
        row = [f"{cell['workload']}, c={cell['concurrency']} {_FIGURE_LABEL[figure]}"]
        for server in others:
            ratio = _round_ratio(cell, server, figure)
            row.append(format_spread(ratio) if ratio else NA)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
