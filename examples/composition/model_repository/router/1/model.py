import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """BLS router: ROUTE "raw" sends RAW straight to `classifier`; anything else runs
    `preprocess` first, then `classifier`, each with a blocking `exec()`."""

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW")
            route = pb_utils.get_input_tensor_by_name(request, "ROUTE").as_numpy()[0]
            features = pb_utils.Tensor("FEATURES", raw.as_numpy())
            if route != b"raw":
                pre = pb_utils.InferenceRequest(
                    model_name="preprocess", inputs=[raw], requested_output_names=["FEATURES"]
                ).exec()
                if pre.has_error():
                    responses.append(pb_utils.InferenceResponse(error=pre.error()))
                    continue
                features = pb_utils.get_output_tensor_by_name(pre, "FEATURES")
            result = pb_utils.InferenceRequest(
                model_name="classifier", inputs=[features], requested_output_names=["LOGITS"]
            ).exec()
            if result.has_error():  # BLS errors come back in the response, never raised
                responses.append(pb_utils.InferenceResponse(error=result.error()))
                continue
            logits = pb_utils.get_output_tensor_by_name(result, "LOGITS")
            responses.append(pb_utils.InferenceResponse([logits]))
        return responses
