"""No config.pbtxt: auto_complete_config declares the tensors. OUTPUT0 = INPUT0."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [1]})
        config.set_max_batch_size(0)
        return config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
