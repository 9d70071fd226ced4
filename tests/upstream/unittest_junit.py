"""Run an upstream qa test file with unittest, as its test.sh does (`python FILE Class -v`),
and write each case's outcome as pytest's junit XML would (what qa_support.CaseResults reads).

Some qa files only work under unittest's own runner: their cases derive from qa/common's
`test_util.TestResultCollector`, whose `run` reads `testsRun` from unittest's result object
(pytest's has none). Each case is bounded like pytest-timeout's signal method: past
`--timeout` seconds the case fails and the next one runs.

    python unittest_junit.py --junitxml=REPORT --timeout=S FILE [Class | Class.case ...]

run in the qa folder (the file's own `sys.path.append("../common")` finds qa/common there).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time
import traceback
import unittest
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

ErrInfo = tuple[type[BaseException], BaseException, TracebackType] | tuple[None, None, None]


class CaseTimeout(Exception):
    pass


class JunitResult(unittest.TextTestResult):
    """unittest's text result (what the cases see), remembering each case's outcome."""

    def __init__(self, timeout: float, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout = timeout
        self.cases: dict[str, tuple[str, str, str, float]] = {}  # id -> (outcome, msg, text, s)
        self._started = 0.0

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 (unittest's name)
        super().startTest(test)
        self._started = time.monotonic()
        self.cases[test.id()] = ("passed", "", "", 0.0)
        signal.signal(signal.SIGALRM, _expired)
        signal.setitimer(signal.ITIMER_REAL, self.timeout)

    def stopTest(self, test: unittest.TestCase) -> None:  # noqa: N802
        signal.setitimer(signal.ITIMER_REAL, 0)
        outcome, message, text, _ = self.cases[test.id()]
        self.cases[test.id()] = (outcome, message, text, time.monotonic() - self._started)
        super().stopTest(test)

    def _mark(self, test: unittest.TestCase, outcome: str, err: ErrInfo | str) -> None:
        if isinstance(err, str):
            message, text = err, err
        else:
            message = f"{err[0].__name__ if err[0] else ''}: {err[1]}"
            text = "".join(traceback.format_exception(*err)) if err[0] else ""
        previous = self.cases.get(test.id(), ("passed", "", "", 0.0))
        if previous[0] == "failed":  # a second failing subtest: keep both texts
            message, text = previous[1], previous[2] + "\n" + text
        self.cases[test.id()] = (outcome, message, text, 0.0)

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self._mark(test, "failed", err)

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self._mark(test, "failed", err)

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self._mark(test, "skipped", reason)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._mark(test, "failed", err)


def _expired(signum: int, frame: FrameType | None) -> None:
    raise CaseTimeout("the case ran past --timeout")


def write_junit(path: str, result: JunitResult) -> None:
    suite = ElementTree.Element("testsuite", name="unittest", tests=str(len(result.cases)))
    for case_id, (outcome, message, text, seconds) in result.cases.items():
        classname, _, name = case_id.rpartition(".")
        case = ElementTree.SubElement(
            suite, "testcase", classname=classname, name=name, time=f"{seconds:.3f}"
        )
        if outcome == "failed":
            ElementTree.SubElement(case, "failure", message=message).text = text
        elif outcome == "skipped":
            ElementTree.SubElement(case, "skipped", message=message)
    root = ElementTree.Element("testsuites")
    root.append(suite)
    ElementTree.ElementTree(root).write(path)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--junitxml", required=True)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("file")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    sys.path.insert(0, os.getcwd())
    sys.argv = [args.file]  # what the file sees, as under `python FILE`
    module = importlib.import_module(Path(args.file).stem)
    loader = unittest.TestLoader()
    if args.names:
        suite = loader.loadTestsFromNames(args.names, module)
    else:
        suite = loader.loadTestsFromModule(module)
    result = JunitResult(args.timeout, unittest.runner._WritelnDecorator(sys.stdout), True, 2)
    suite.run(result)
    result.printErrors()
    write_junit(args.junitxml, result)
    failures, errors = len(result.failures), len(result.errors)
    print(f"Ran {result.testsRun} tests: {failures} failures, {errors} errors")
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    raise SystemExit(main())
