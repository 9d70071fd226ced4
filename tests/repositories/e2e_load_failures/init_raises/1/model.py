"""initialize raises: the model must fail to load and the others must keep serving."""


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("e2e init_raises refuses to start")

    def execute(self, requests):
        return [None for _ in requests]
