"""initialize fails: a helper it calls raises RuntimeError."""


def open_resources(args):
    raise RuntimeError(f"init_raises cannot start version {args['model_version']}")


class TritonPythonModel:
    def initialize(self, args):
        open_resources(args)

    def execute(self, requests):
        return [None for _ in requests]
