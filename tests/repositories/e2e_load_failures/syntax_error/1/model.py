"""Does not compile: the class statement lacks its colon."""


class TritonPythonModel
    def execute(self, requests):
        return [None for _ in requests]
