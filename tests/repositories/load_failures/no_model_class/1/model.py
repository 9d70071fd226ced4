"""model.py without a TritonPythonModel class."""


class SomeOtherModel:
    def execute(self, requests):
        return []
