"""initialize calls sys.exit(3): the load must fail, the server must live on."""

import sys


class TritonPythonModel:
    def initialize(self, args):
        sys.exit(3)

    def execute(self, requests):
        return [None for _ in requests]
