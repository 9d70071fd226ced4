"""Running a folder of Triton's `qa/L0_backend_python` against the bridge, as its `test.sh` does.

Each folder's `test.sh` copies models from `qa/python_models` into `models/`, edits their
`config.pbtxt` with `sed`/`echo`, starts tritonserver with some flags and runs its test file with
`python3 -m pytest --junitxml=…`. Here each server start is a `Phase`: the same layout made in
Python (`Layout`), the bridge started with the flags it has among those (`run_phase`), and the
unmodified test file run with pytest in
the folder (its `sys.path.append("../../common")` finds `test_util`/`shm_util` there; qa/common is
also put on PYTHONPATH as test.sh's environment has it). Each upstream test case is then reported
as a test of ours from the junit XML (`CaseResults`); the cases are listed at collection time
from the test file's source in the archive (`upstream_cases`), so one that never ran is a failure
rather than a silent gap.
"""

from __future__ import annotations

import ast
import os
import posixpath
import re
import shutil
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.harness.gpu import gpu_missing
from tests.upstream.support import ARCHIVE, HERE, Run, run_in_namespace

QA = "server/qa"
CASE_TIMEOUT_S = 60
CLIENT_TIMEOUT_S = 240.0
L0 = f"{QA}/L0_backend_python"
UNITTEST_JUNIT = HERE / "unittest_junit.py"


class Layout:
    """The `mkdir -p` / `cp` / `sed -i` / `echo >>` steps of one test.sh, on one models folder."""

    def __init__(self, root: Path, models: Path) -> None:
        self.python_models = root / QA / "python_models"
        self.models = models
        models.mkdir(parents=True, exist_ok=True)

    def model(
        self,
        source: str,
        name: str | None = None,
        model_file: str = "model.py",
        extra_files: tuple[str, ...] = (),
        config: bool = True,
    ) -> Path:
        """`mkdir -p models/NAME/1; cp python_models/SOURCE/{model.py,config.pbtxt} …`."""
        target = self.models / (name or source)
        (target / "1").mkdir(parents=True, exist_ok=True)
        source_folder = self.python_models / source
        shutil.copyfile(source_folder / model_file, target / "1" / "model.py")
        for extra in extra_files:
            shutil.copyfile(source_folder / extra, target / "1" / extra)
        if config:
            shutil.copyfile(source_folder / "config.pbtxt", target / "config.pbtxt")
        return target

    def copy_tree(self, source: Path, name: str) -> Path:
        target = self.models / name
        shutil.copytree(source, target, dirs_exist_ok=True)
        return target

    @staticmethod
    def set_line(model: Path, key: str, value: str) -> None:
        """`sed -i "s/^KEY:.*/KEY: VALUE/" config.pbtxt` (VALUE "" deletes the line's text)."""
        config = model / "config.pbtxt"
        replacement = f"{key}: {value}" if value else ""
        text = re.sub(rf"(?m)^{re.escape(key)}:.*", lambda _: replacement, config.read_text())
        config.write_text(text)

    @staticmethod
    def replace_all(model: Path, old: str, new: str) -> None:
        """`sed -i "s/OLD/NEW/g" config.pbtxt`."""
        config = model / "config.pbtxt"
        config.write_text(config.read_text().replace(old, new))

    @staticmethod
    def append(model: Path, line: str) -> None:
        """`echo "LINE" >> config.pbtxt`."""
        with open(model / "config.pbtxt", "a") as config:
            config.write(line + "\n")


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)  # unittest.IsolatedAsyncioTestCase's too


def upstream_cases(test_file: str) -> list[str]:
    """`Class::test_name` of every test method (and `test_name` of every test function) in one
    upstream test file, read from the archive's source."""
    with tarfile.open(ARCHIVE) as archive:
        member = archive.extractfile(posixpath.normpath(f"{L0}/{test_file}"))
        assert member is not None
        tree = ast.parse(member.read())
    cases = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            cases += [f"{node.name}::{name}" for name in _test_methods(node.body)]
        elif isinstance(node, FUNCTIONS) and node.name.startswith("test"):
            cases.append(node.name)
    return cases


def _test_methods(body: list[ast.stmt]) -> list[str]:
    """Test methods of a class body, also those defined under an `if` (python_test.py defines
    its GPU cases under `if not _test_jetson and not _test_windows:`)."""
    names = []
    for item in body:
        if isinstance(item, FUNCTIONS) and item.name.startswith("test"):
            names.append(item.name)
        elif isinstance(item, ast.If):
            names += _test_methods(item.body) + _test_methods(item.orelse)
    return names


@dataclass
class Step:
    """One `python3 -m pytest --junitxml=… FILE` line of a test.sh: FILE relative to the qa
    folder, with the variables test.sh exports for it; `select` names the cases it runs (all
    when empty: test.sh's `FILE::Class::case` lines), `skip` those left out here."""

    label: str
    test_file: str
    env: dict[str, str] = field(default_factory=dict)
    select: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    case_timeout: int = CASE_TIMEOUT_S
    # "pytest", or "unittest" for a file whose cases only run under unittest's own runner
    # (qa/common test_util.TestResultCollector's), as its test.sh runs it: unittest_junit.py.
    runner: str = "pytest"

    folder: str = ""

    def cases(self) -> list[str]:
        every = upstream_cases(f"{self.folder}/{self.test_file}")
        return [case for case in every if not self.select or _selected(case, self.select)]

    def junit(self) -> str:
        return f"{self.label}.report.xml"

    def command(self) -> str:
        prefix = ["env", *(f"{name}={value}" for name, value in self.env.items())]
        # Cases are named one by one when some are left out: pytest's --deselect matches node
        # ids by prefix (deselecting test_a would also drop test_a_b).
        cases = self.cases() if self.skip or self.select else []
        chosen = [case for case in cases if case not in self.skip]
        if self.runner == "unittest":
            # test.sh's `python FILE Class -v`, each case's outcome written as junit XML.
            return " ".join(
                [
                    *prefix,
                    sys.executable,
                    str(UNITTEST_JUNIT),
                    f"--junitxml={self.junit()}",
                    f"--timeout={self.case_timeout}",
                    self.test_file,
                    *(case.replace("::", ".") for case in chosen),
                ]
            )
        targets = [f"{self.test_file}::{case}" for case in chosen]
        return " ".join(
            [
                *prefix,
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                # Each case bounded: pytest-timeout's signal method fails a hung case and goes
                # on to the next, where test.sh would hang.
                "-o",
                "timeout_method=signal",
                f"--timeout={self.case_timeout}",
                f"--junitxml={self.junit()}",
                *(targets or [self.test_file]),
            ]
        )


def _selected(case: str, select: tuple[str, ...]) -> bool:
    """`Class::case` named in `select`, itself or by its class (test.sh's `FILE Class`)."""
    return any(case == name or case.startswith(f"{name}::") for name in select)


@dataclass
class CaseResults:
    """Each case's outcome in one step's junit XML: "passed", "failed" (with its text),
    "skipped", or missing."""

    outcomes: dict[str, tuple[str, str]]

    @classmethod
    def read(cls, report: Path) -> CaseResults:
        outcomes: dict[str, tuple[str, str]] = {}
        if not report.exists():
            return cls(outcomes)
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            classname = case.get("classname", "")
            # "decoupled_test.DecoupledTest" -> "DecoupledTest"; a module-level function has
            # only the module name as its classname.
            owner = classname.rsplit(".", 1)[1] if "." in classname else ""
            key = f"{owner}::{case.get('name')}" if owner else str(case.get("name"))
            outcome, text = "passed", ""
            for child in case:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                    text += (child.get("message") or "") + "\n" + (child.text or "")
                elif child.tag == "skipped" and outcome == "passed":
                    outcome, text = "skipped", child.get("message") or ""
            outcomes[key] = (outcome, text)
        return cls(outcomes)


@dataclass
class Phase:
    """One server of a test.sh: its models (`layout`), its flags, the environment it runs in
    (test.sh's exports the models read, e.g. BLS_KIND), the name its log is read by, the pytest
    steps run against it, and the checks test.sh makes on its log after it stopped."""

    name: str
    # The qa folder, relative to qa/L0_backend_python ("" for it, "../L0_parameters" for
    # another qa folder).
    folder: str
    layout: Callable[[Layout], None]
    steps: list[Step]
    # test.sh's SERVER_ARGS that the bridge has (all but --model-repository and
    # --backend-directory, which have no meaning here).
    server_args: tuple[str, ...] = ("--log-verbose=1",)
    # `{root}` in a value is the folder the archive is unpacked in.
    env: dict[str, str] = field(default_factory=dict)
    server_log: str = "server.log"
    # test.sh's checks after the server stopped: on its log (`grep`), on files (`[ -e … ]`).
    log_checks: dict[str, Callable[[PhaseRun], None]] = field(default_factory=dict)
    # Commands test.sh runs before its pytest (e.g. a `curl` to /v2/logging), and after it
    # while the server still runs (e.g. its `wait_for_server_live`), in the folder.
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    # The folder under the qa folder that test.sh lays the models out in (its MODELDIR).
    models_dir: str = "models"
    # False where the folder ships a models/ of its own that test.sh adds to.
    fresh_models: bool = True
    # False where test.sh expects the server to fail its start (`run_server_nowait; wait`).
    expect_ready: bool = True
    # The server's address-space bound in bytes (0: none), where models allocate large tensors.
    memory_limit: int = 0


@dataclass
class PhaseRun:
    """A phase served once: what the namespace run printed, each step's cases, the log."""

    run: Run
    cases: dict[str, CaseResults]
    commands: dict[str, str]
    server_log: str
    folder: Path

    def outcome(self, label: str, case: str) -> tuple[str, str]:
        results = self.cases.get(label)
        if results is None or case not in results.outcomes:
            return "missing", ""
        return results.outcomes[case]

    def step_output(self, label: str) -> str:
        return self.run.client_output(self.commands[label])


def run_phase(root: Path, phase: Phase, skipped: set[str]) -> PhaseRun:
    """Lay out `phase`'s models afresh (test.sh's `rm -rf models`) and serve them, running
    each step's pytest in the qa folder inside a namespace; `skipped` holds the `label::case`
    ids left out."""
    qa_folder = root / L0 / phase.folder
    models = qa_folder / phase.models_dir
    if phase.fresh_models:
        shutil.rmtree(models, ignore_errors=True)
    phase.layout(Layout(root, models))
    steps = []
    for step in phase.steps:
        step = replace(step, folder=phase.folder)
        step = replace(
            step, skip=tuple(case for case in step.cases() if f"{step.label}::{case}" in skipped)
        )
        if set(step.skip) != set(step.cases()):
            steps.append(step)
    for step in steps:
        (qa_folder / step.junit()).unlink(missing_ok=True)
    common = root / QA / "common"
    # shm_util's leak probe reads Triton's stub-to-server shared memory regions
    # (triton_python_backend_shm_region_*) through Triton's compiled triton_shm_monitor module;
    # the bridge has no such regions, and the module does not exist here. TEST_JETSON=1 is
    # shm_util's own switch that turns the probe off, and the tests' GPU cases with it. On a
    # GPU host an empty triton_shm_monitor is given instead: the GPU cases run, the probe
    # watches no region.
    env = {"PYTHONPATH": str(common)}
    if gpu_missing() is None:
        no_monitor = root / "no_shm_monitor"
        no_monitor.mkdir(exist_ok=True)
        (no_monitor / "triton_shm_monitor.py").write_text("")
        env["PYTHONPATH"] += os.pathsep + str(no_monitor)
    else:
        env["TEST_JETSON"] = "1"
    run = run_in_namespace(
        models,
        qa_folder,
        [*phase.before, *(step.command() for step in steps), *phase.after],
        server_args=phase.server_args,
        client_env=env,
        client_timeout=max([CLIENT_TIMEOUT_S, *(step.case_timeout * 2 for step in steps)]),
        server_log=phase.server_log,
        env={
            # The triton door unless the caller picks one (it becomes the default door).
            "DYN_BRIDGE_FRONTEND": os.environ.get("DYN_BRIDGE_FRONTEND", "triton"),
            **{name: value.format(root=root) for name, value in phase.env.items()},
        },
        server_memory_limit=phase.memory_limit,
        startup_timeout=120.0 if phase.expect_ready else 30.0,
    )
    cases = {step.label: CaseResults.read(qa_folder / step.junit()) for step in steps}
    log_path = qa_folder / phase.server_log
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    commands = {step.label: step.command() for step in steps}
    return PhaseRun(run, cases, commands, log, qa_folder)
