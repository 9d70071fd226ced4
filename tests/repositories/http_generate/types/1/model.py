import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            out.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor(
                            "O" + n[1:], pb_utils.get_input_tensor_by_name(r, n).as_numpy()
                        )
                        for n in ("I_BOOL", "I_U8", "I_I64", "I_F16", "I_F64", "I_STR")
                    ]
                )
            )
        return out
