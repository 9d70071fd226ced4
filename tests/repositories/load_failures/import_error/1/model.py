"""model.py importing a module that does not exist."""

import module_that_does_not_exist_4711  # noqa: F401


class TritonPythonModel:
    def execute(self, requests):
        return []
