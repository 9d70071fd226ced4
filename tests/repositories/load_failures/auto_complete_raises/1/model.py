"""auto_complete_config raises; there is no config.pbtxt at all."""


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        raise ValueError("auto_complete_raises does not know its inputs")

    def execute(self, requests):
        return [None for _ in requests]
