#!/usr/bin/env bash
# The GPU suite, on a host with an NVIDIA GPU: tests/gpu, the GPU parts of the unit tests, and
# Triton's own qa cases that need a GPU (tests/upstream: io, decoupled, bls_async), which run
# unmodified once a GPU is found (tests/harness/gpu.py).
#
# It uses the Python it is given as it is (PYTHON, default python3): that Python's torch must
# have CUDA, so nothing here installs torch. Give it the project and its test tools first:
#   python3 -m pip install -e '.[gpu]' pytest pytest-timeout pytest-xdist 'tritonclient[all]' \
#       prometheus_client ml_dtypes requests
# (or, on a host without network, the recipe in the project's GPU notes). Extra arguments go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! reason=$("$PYTHON" -c 'from tests.harness.gpu import gpu_missing; r = gpu_missing(); print(r or ""); raise SystemExit(1 if r else 0)' 2>&1); then
  echo "scripts/test_gpu.sh: cannot run the GPU suite here: ${reason##*$'\n'}" >&2
  exit 2
fi
"$PYTHON" -m pytest -p no:cacheprovider tests/gpu tests/unit/test_gpu_devices.py \
  tests/unit/test_gpu_tensors.py tests/upstream/test_qa_backend_python.py \
  -k "gpu or io or decoupled or bls_async" "$@"
