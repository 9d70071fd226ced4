import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # Kept: a family deleted before its metrics makes them unusable, as in Triton.
        self.family = pb_utils.MetricFamily(
            "side_calls", "BLS calls made", pb_utils.MetricFamily.COUNTER
        )
        self.calls = self.family.Metric(labels={})

    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="target",
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                requested_output_names=["OUT"],
            )
            answer = call.exec()
            self.calls.increment(1)
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = pb_utils.get_output_tensor_by_name(answer, "OUT")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out.as_numpy())]))
        return responses
