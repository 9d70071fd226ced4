"""A torch model on the GPU, from 4 floats to 16M floats: the door beside the same model called
in-process (the floor) and real Triton where it runs on the GPU host.

The model takes FP32 × n, moves it to `cuda:<device>`, doubles it there, and answers with the
CUDA tensor (`Tensor.from_dlpack`): the path most Triton GPU models take. The floor is the
loader alone in this process (`Model.infer`, the host copy of the answer read as a wire
would), so `door ÷ floor` is what gRPC and the door cost on top of the GPU work and the two
host copies every served request pays. Per size: p50 at c=1 and requests/s at c=32, each
server's turns interleaved (`--rounds`).

    python -m benchmarks.gpu_torch                      # door, floor (and triton if found)
    python -m benchmarks.gpu_torch --sizes 4,1048576 --seconds 2 --rounds 2

Needs a GPU, torch with CUDA, and the `[gpu]` extra; prints why not otherwise.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from benchmarks.closed_loop import LoadResult, closed_loop, pooled
from benchmarks.servers import make_targets, start_targets, stop_targets
from tests.harness.gpu import gpu_missing

MODEL = "torch_double"
SIZES = (4, 4096, 262_144, 16_777_216)
SERVERS = ("door", "triton")

MODEL_PY = """
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            data = torch.from_dlpack(tensor.to_dlpack()).to(self.device) * 2
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUT", data)]))
        return responses
"""

CONFIG = """name: "torch_double"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { kind: KIND_GPU, count: 2 } ]
"""


def write_repository(root: Path) -> Path:
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(CONFIG)
    (root / MODEL / "1" / "model.py").write_text(MODEL_PY)
    return root


def served(url: str, size: int, concurrency: int, seconds: float) -> LoadResult:
    data = np.ones(size, np.float32)

    def inputs() -> list[grpcclient.InferInput]:
        tensor = grpcclient.InferInput("IN", [size], "FP32")
        tensor.set_data_from_numpy(data)
        return [tensor]

    return closed_loop(url, MODEL, inputs, concurrency, seconds, warmup=min(1.0, seconds / 2))


def in_process(repository: Path, size: int, concurrency: int, seconds: float) -> LoadResult:
    """The floor: the loader's own `infer` from `concurrency` threads, the answer copied to the
    host as the wire copies it."""
    from model_repository_loader.config import ConfigOptions
    from model_repository_loader.gpu.devices import supported_gpu_ids, visible_devices
    from model_repository_loader.inference import InferRequest
    from model_repository_loader.loader import load_repository
    from model_repository_loader.pb_utils import Tensor

    options = ConfigOptions(gpu_ids=supported_gpu_ids(visible_devices()))
    repo = load_repository([repository], options, only=[MODEL])
    result = LoadResult(seconds)
    lock = threading.Lock()
    model = repo.models[MODEL]
    data = np.ones(size, np.float32)

    def worker(deadline: float, record: bool) -> None:
        while time.monotonic() < deadline:
            start = time.perf_counter()
            response = model.infer(InferRequest(inputs=[Tensor("IN", data)]))
            response.output_tensors()[0]._array  # noqa: B018 - the host copy a wire makes
            if record:
                with lock:
                    result.latencies_ms.append((time.perf_counter() - start) * 1000)

    try:
        for record, span in ((False, min(1.0, seconds / 2)), (True, seconds)):
            deadline = time.monotonic() + span
            threads = [
                threading.Thread(target=worker, args=(deadline, record)) for _ in range(concurrency)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        repo.close()
    return result


def _ratio(values: dict, a: str, b: str) -> str:
    x, y = values.get(a), values.get(b)
    return f"{x / y:.2f}" if isinstance(x, float) and isinstance(y, float) else "n/a"


def _ratio(values: dict, a: str, b: str) -> str:
    x, y = values.get(a), values.get(b)
    return f"{x / y:.2f}" if isinstance(x, float) and isinstance(y, float) else "n/a"


def format_table(results: dict[str, dict[str, dict]], columns: list[str]) -> str:
    lines = [
        "| FP32 × n | cell | " + " | ".join(columns) + " | door ÷ floor | door ÷ triton |",
        "|---|---|" + "---|" * (len(columns) + 2),
    ]
    for cell, figures in results.items():
        size, metric = cell.split("/", 1)
        values = {c: figures.get(c) for c in columns}
        shown = [f"{v:.2f}" if isinstance(v, float) else "n/a" for v in values.values()]
        lines.append(
            f"| {size} | {metric} | "
            + " | ".join(shown)
            + f" | {_ratio(values, 'door', 'floor')} | {_ratio(values, 'door', 'triton')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--servers", default=",".join(SERVERS), help="of door, triton")
    parser.add_argument("--seconds", type=float, default=6.0, help="per cell, over all rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    reason = gpu_missing()
    if reason is not None:
        print(f"benchmarks.gpu_torch needs a GPU: {reason}")
        return 2
    sizes = [int(s) for s in args.sizes.split(",") if s]
    names = [n for n in args.servers.split(",") if n]
    cells = [(size, c) for size in sizes for c in (1, 32)]
    turns: dict[tuple[int, int], dict[str, list[LoadResult]]] = {cell: {} for cell in cells}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        repository = write_repository(Path(tmp) / "repository")
        targets = make_targets(names, Path(tmp) / "logs")
        try:
            start_targets(targets, repository, [MODEL])
            live = [t for t in targets if t.server is not None]
            for _ in range(args.rounds):
                for size, concurrency in cells:
                    span = args.seconds / args.rounds
                    for target in live:
                        turn = served(target.url, size, concurrency, span)
                        turns[(size, concurrency)].setdefault(target.name, []).append(turn)
                    floor = in_process(repository, size, concurrency, span)
                    turns[(size, concurrency)].setdefault("floor", []).append(floor)
            reasons = {t.name: t.reason for t in targets if t.server is None}
        finally:
            stop_targets(targets)
    results: dict[str, dict[str, dict]] = {}
    for (size, concurrency), by_server in turns.items():
        metric = "p50 ms, c=1" if concurrency == 1 else "req/s, c=32"
        row: dict = {}
        for server, server_turns in by_server.items():
            summary = pooled(server_turns).summary()
            row[server] = summary["p50_ms" if concurrency == 1 else "throughput"]
        results[f"{size}/{metric}"] = row
    columns = ["floor", *names]
    print(format_table(results, columns))
    for name, why in reasons.items():
        print(f"{name}: n/a ({why})")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "reasons": reasons}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
