"""strict_divide: QUOTIENT = NUMERATOR / DENOMINATOR, or an INVALID_ARG error for that request."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            num = pb_utils.get_input_tensor_by_name(request, "NUMERATOR").as_numpy()
            den = pb_utils.get_input_tensor_by_name(request, "DENOMINATOR").as_numpy()

            if num.shape != den.shape:
                error = pb_utils.TritonError(
                    f"NUMERATOR shape {list(num.shape)} differs from DENOMINATOR shape "
                    f"{list(den.shape)}",
                    pb_utils.TritonError.INVALID_ARG,
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue

            zeros = int(np.count_nonzero(den == 0))
            if zeros:
                # A response carrying an error fails only this request; the client sees the
                # message as is, with the status INVALID_ARGUMENT.
                error = pb_utils.TritonError(
                    f"division by zero: DENOMINATOR has {zeros} zero element(s)",
                    pb_utils.TritonError.INVALID_ARG,
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue

            quotient = pb_utils.Tensor("QUOTIENT", (num / den).astype(np.float32))
            responses.append(pb_utils.InferenceResponse([quotient]))
        return responses
