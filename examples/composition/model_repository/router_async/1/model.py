import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Async BLS router: asks `classifier` about RAW as it is and about the `preprocess`ed RAW
    at the same time (asyncio.gather over `async_exec()`), and answers the sum of both LOGITS.
    ROUTE is ignored."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW")
            pre = await pb_utils.InferenceRequest(
                model_name="preprocess", inputs=[raw], requested_output_names=["FEATURES"]
            ).async_exec()
            features = pb_utils.get_output_tensor_by_name(pre, "FEATURES")
            direct = pb_utils.Tensor("FEATURES", raw.as_numpy())
            calls = [
                pb_utils.InferenceRequest(
                    model_name="classifier", inputs=[x], requested_output_names=["LOGITS"]
                ).async_exec()
                for x in (direct, features)
            ]
            results = await asyncio.gather(*calls)
            failed = next((r for r in results if r.has_error()), None)
            if failed is not None:
                responses.append(pb_utils.InferenceResponse(error=failed.error()))
                continue
            total = sum(pb_utils.get_output_tensor_by_name(r, "LOGITS").as_numpy() for r in results)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LOGITS", total)]))
        return responses
