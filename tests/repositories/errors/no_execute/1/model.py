"""Defines initialize but no execute method: loads, then every request fails."""


class TritonPythonModel:
    def initialize(self, args):
        self.ready = True
