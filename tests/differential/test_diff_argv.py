"""`sys.argv` inside a model, and `unittest.main()` run in `execute` (tests/repositories/argv).

Triton's stub shows a model `[""]` (2.51), in `initialize` and `execute`; models that parse it
(argparse, `unittest.main`, as several of Triton's own test models do) must not meet the
server's command line. Each model exists as a thread instance and as a process instance
(`*_process`, BRIDGE_INSTANCE_KIND=process; Triton ignores the parameter).
"""

from __future__ import annotations

import pytest

from tests.differential.support import Pair, both, bytes_output, int32_input

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def argv(pair_for, repository) -> Pair:
    return pair_for(repository("argv"))  # `*_process` run their thread twin's model.py


def _answer(pair: Pair, model: str, output: str) -> tuple[list[bytes], list[bytes]]:
    triton, bridge = both(pair, lambda c: c.infer(model, [int32_input([1], "IN")]))
    return bytes_output(triton, output), bytes_output(bridge, output)


@pytest.mark.parametrize("model", ["argv", "argv_process"])
def test_a_model_sees_the_stubs_argv(argv: Pair, model: str):
    triton, bridge = _answer(argv, model, "ARGV")
    assert triton == [b"['']\n['']"]  # at initialize, at execute
    assert bridge == triton


@pytest.mark.parametrize("model", ["unittest_main", "unittest_main_process"])
def test_unittest_main_runs_inside_execute(argv: Pair, model: str):
    triton, bridge = _answer(argv, model, "OK")
    assert triton == [b"OK (2 tests)"]
    assert bridge == triton
