#!/usr/bin/env bash
# Prepares, on a machine with network, what the GPU suite needs on an offline GPU host whose
# image already has Python 3.12, torch with CUDA, cupy, numpy, grpcio, protobuf, pytest(-xdist,
# -timeout), uvloop, httpx, cuda-bindings and nvidia-ml-py (the project's GPU notes say which
# host that is): the server's other dependencies and tritonclient's as wheels for that Python,
# and the Dynamo runtime stripped so that everything fits one 64 MiB copy. Writes .dev/ (which
# git ignores once this has run); scripts/gpu_host.sh uses it on the host.
#   bash scripts/gpu_bundle.sh            # then carry .dev to the host with the checkout
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >> .git/info/exclude
rm -rf .dev && mkdir -p .dev/whl

# The versions this checkout is tested with here, for those the host image lacks.
WHEELS=(tritonclient watchdog starlette uvicorn httptools python-rapidjson pydantic
        pydantic-core annotated-types typing-inspection geventhttpclient gevent greenlet
        zope.event zope.interface brotli)
pinned=()
for name in "${WHEELS[@]}"; do
  version=$("$PYTHON" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  pinned+=("$name${version:+==$version}")
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .dev/whl "${pinned[@]}"

# ai-dynamo-runtime: one abi3 wheel (~75 MB), stripped and recompressed (~38 MB).
dynamo=$("$PYTHON" -m pip show ai-dynamo-runtime | sed -n 's/^Version: //p')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$work" "ai-dynamo-runtime==$dynamo"
mkdir "$work/unpacked"
(cd "$work/unpacked" && unzip -q "$work"/ai_dynamo_runtime-*.whl)
strip --strip-unneeded "$work"/unpacked/dynamo/_core*.so
tar cf - -C "$work/unpacked" . | xz -T2 -9 > .dev/dynamo-runtime.tar.xz
du -sh .dev
