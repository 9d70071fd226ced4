"""OUTPUT0 = INPUT0, but execute raises ValueError when any input value is negative."""

import triton_python_backend_utils as pb_utils


def check(values):
    if (values < 0).any():
        raise ValueError(f"flaky refuses negative values: {values.tolist()}")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            check(values)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", values)]))
        return responses
