"""Runs a unittest suite inside `execute`, as several of Triton's own test models do.

`unittest.main` parses `sys.argv` (argparse): it only works if the model sees an argument list
with nothing unittest does not understand, as under Triton's stub ([""]). OK = "OK (2 tests)"
if every test passed, else the failures' text (or the SystemExit code argparse raised).
"""

import io
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class TensorChecks(unittest.TestCase):
    def test_round_trip(self):
        tensor = pb_utils.Tensor("T", np.arange(3, dtype=np.int32))
        self.assertEqual(tensor.as_numpy().tolist(), [0, 1, 2])

    def test_bad_name_is_refused(self):
        with self.assertRaises(TypeError):
            pb_utils.Tensor(None, np.zeros(1))


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for _ in requests:
            stream = io.StringIO()
            try:
                program = unittest.main(
                    "model",  # as Triton's own test models name it
                    exit=False,
                    testRunner=unittest.TextTestRunner(stream=stream),
                )
                result = program.result
                passed = result.wasSuccessful() and result.testsRun
                text = f"OK ({result.testsRun} tests)" if passed else stream.getvalue()
            except SystemExit as exc:
                text = f"SystemExit: {exc.code}"
            out = np.array([text.encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OK", out)]))
        return responses
