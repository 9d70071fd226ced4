"""Scraping a metrics port and the known traffic that tests/e2e/test_metrics.py and
tests/differential/test_diff_metrics.py send (tests/repositories/metrics)."""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

# counted_process runs counted's model.py: tests get the repository whole through the
# `repository` fixture (tests/conftest.py).
METRICS = "metrics"


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """GET /metrics, parsed by prometheus_client: {sample name: {sorted labels: value}}.

    The parser names a counter's sample `<family>_total` whatever the text says (OpenMetrics);
    Triton's counters have no such suffix, so counter samples are keyed by the family's name.
    """
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            name = family.name if family.type == "counter" else sample.name
            samples.setdefault(name, {})[key] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float | None:
    """One sample's value, None when absent."""
    return samples.get(name, {}).get(tuple(sorted(labels.items())))


def rows_input(value: int, rows: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("IN", [rows, 1], "INT32")
    tensor.set_data_from_numpy(np.full((rows, 1), value, np.int32))
    return tensor


def infer(client: grpcclient.InferenceServerClient, model: str, value: int, rows: int) -> str:
    """'ok' or the error text."""
    try:
        client.infer(model, [rows_input(value, rows)], client_timeout=60)
        return "ok"
    except InferenceServerException as exc:
        return str(exc)


def send_known_traffic(url: str, model: str = "counted") -> list[str]:
    """Requests of 1, 2, 1 (IN = -1: an error response) and 4 rows, which fill one batch of 8
    and leave together; then one of 8 rows with IN = -2 (execute raises). Outcomes in order."""
    client = grpcclient.InferenceServerClient(url)
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(
            pool.map(lambda a: infer(client, model, *a), [(1, 1), (2, 2), (-1, 1), (3, 4)])
        )
    outcomes.append(infer(client, model, -2, 8))
    client.close()
    return outcomes
