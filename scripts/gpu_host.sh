#!/usr/bin/env bash
# On the offline GPU host, with .dev/ from scripts/gpu_bundle.sh beside the checkout: installs
# the wheels and the runtime into /tmp/site, then runs the GPU suite (scripts/test_gpu.sh) and
# the GPU benchmark, each log also written under $OUT (default /tmp/gpu-out).
#   bash scripts/gpu_host.sh              # everything
#   bash scripts/gpu_host.sh tests        # only the suite; `bench` for only the benchmark
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .dev/whl/*.whl || exit
tar xJf .dev/dynamo-runtime.tar.xz -C /tmp/site || exit
# Triton's qa helpers import its compiled shared-memory probe unless it is there: an empty one
# watches no region (the bridge has none of Triton's stub regions).
: > /tmp/site/triton_shm_monitor.py
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'
} 2>&1 | tee "$OUT/host.txt"
status=0
if [ "${1:-all}" != bench ]; then
  bash scripts/test_gpu.sh -q -ra --timeout 300 -n 4 --dist loadfile 2>&1 | tee "$OUT/tests.log"
  status=${PIPESTATUS[0]}
fi
if [ "${1:-all}" != tests ]; then
  python3 -m benchmarks.gpu_torch --json "$OUT/gpu_torch.json" 2>&1 | tee "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit "$status"
