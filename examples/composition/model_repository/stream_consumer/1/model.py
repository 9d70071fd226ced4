import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled BLS consumer: iterates `token_source`'s responses (`exec(decoupled=True)`) and
    answers the tokens joined by spaces, plus how many responses the iterator yielded (the
    last one is empty: it only says the stream is over)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "COUNT")
            stream = pb_utils.InferenceRequest(
                model_name="token_source", inputs=[count], requested_output_names=["TOKEN"]
            ).exec(decoupled=True)
            words, seen, error = [], 0, None
            for response in stream:
                seen += 1
                if response.has_error():
                    error = response.error()
                    break
                if len(response.output_tensors()) > 0:
                    words.append(
                        pb_utils.get_output_tensor_by_name(response, "TOKEN").as_numpy()[0]
                    )
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            text = pb_utils.Tensor("TEXT", np.array([b" ".join(words)], dtype=object))
            count_out = pb_utils.Tensor("RESPONSES", np.array([seen], dtype=np.int32))
            responses.append(pb_utils.InferenceResponse([text, count_out]))
        return responses
