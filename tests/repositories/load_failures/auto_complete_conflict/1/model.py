"""auto_complete_config declares INPUT0 as INT32 while config.pbtxt says FP32."""


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input(
            {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}
        )
        return auto_complete_model_config

    def execute(self, requests):
        return [None for _ in requests]
