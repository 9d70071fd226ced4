"""benchmarks/gpu_torch.py without a GPU: it says why and stops; its table's shape."""

from __future__ import annotations

import pytest

from benchmarks import gpu_torch
from tests.harness.gpu import gpu_missing


@pytest.mark.skipif(gpu_missing() is None, reason="a GPU is here: the benchmark would run")
def test_without_a_gpu_it_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_torch.main(["--seconds", "0.1", "--rounds", "1"]) == 2
    assert "needs a GPU: " in capsys.readouterr().out


def test_the_table_has_a_row_per_cell_and_the_ratios() -> None:
    results = {
        "4/p50 ms, c=1": {"floor": 0.5, "door": 1.0, "triton": 0.8},
        "4/req/s, c=32": {"floor": 4000.0, "door": 2000.0},
    }
    table = gpu_torch.format_table(results, ["floor", "door", "triton"]).splitlines()
    assert table[2] == "| 4 | p50 ms, c=1 | 0.50 | 1.00 | 0.80 | 2.00 | 1.25 |"
    assert table[3] == "| 4 | req/s, c=32 | 4000.00 | 2000.00 | n/a | 0.50 | n/a |"
