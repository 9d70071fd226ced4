"""model.py that does not compile (missing colon on the class line)."""


class TritonPythonModel
    def execute(self, requests):
        return []
