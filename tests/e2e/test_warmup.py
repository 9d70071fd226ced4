"""Warmup on hot reload: a changed model warms up before it takes traffic, and a change whose
warmup fails leaves the serving generation alone.

The warmup probe (tests/repositories/warmup) answers a request with the parameter `report` with
the `execute` calls it got before: every answer during and after a reload must list a finished
warmup (never an empty list: a cold generation), and the new generation is told apart by its
sample count.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tests.e2e.reload_support import write_file
from tests.e2e.support import wait_until, warmup_repository


def _calls(client: grpcclient.InferenceServerClient) -> int:
    tensor = grpcclient.InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 4), np.float32))
    answer = client.infer("warm_zero", [tensor], parameters={"report": True})
    return len(json.loads(answer.as_numpy("CALLS")[0]))


def test_a_reload_warms_up_before_the_swap(bridge_server, tmp_path: Path) -> None:
    repo = warmup_repository(tmp_path / "repo", "warm_zero")
    server = bridge_server(repo, "--reload-debounce-secs", "0.2")
    client = server.client()
    assert _calls(client) == 3  # zeros twice, random once; the batch-0 sample skipped

    config = repo / "warm_zero" / "config.pbtxt"
    original = config.read_text()
    assert original.count("count: 2") == 1
    write_file(config, original.replace("count: 2", "count: 5"))
    seen: list[int] = []

    def swapped() -> bool:
        seen.append(_calls(client))
        return seen[-1] == 6

    wait_until(swapped, "the new generation answering")
    assert set(seen) <= {3, 6}, seen  # no answer from a generation that had not warmed up

    text = config.read_text()
    write_file(config, text + 'parameters { key: "fail_warmup" value { string_value: "on" } }\n')
    wait_until(lambda: "failed to run warmup sample" in server.log_text, "the failed reload")
    assert _calls(client) == 6  # the warm generation still serves
    assert client.is_model_ready("warm_zero")
