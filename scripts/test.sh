#!/usr/bin/env bash
# Install everything the test suite needs, from this checkout, and run it.
#   .venv         the product + test tools (numpy 2.x)
#   .venv-oracle  nvidia-pytriton: the real tritonserver the differential tests compare against.
#                 It pins numpy < 2, so it lives apart from the product.
#   .venv-numpy1  the product with numpy 1.x, for the unit tests.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k codec`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then "$PYTHON" -m venv .venv; fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test,upstream,gpu]"

if [ ! -x .venv-oracle/bin/python ]; then "$PYTHON" -m venv .venv-oracle; fi
.venv-oracle/bin/python -m pip install --quiet --disable-pip-version-check nvidia-pytriton
export DYNAMO_BRIDGE_ORACLE_PYTHON="$PWD/.venv-oracle/bin/python"

#   .dynamo-frontend  Dynamo's standalone frontend (`python -m dynamo.frontend`), for
#                 tests/e2e/test_standalone_frontend.py: ai-dynamo 1.6.1 requires a placeholder
#                 package (aisimulate), so it is installed without dependencies, beside .venv's
#                 ai-dynamo-runtime, with the two it needs (docs/deployment.md).
if [ ! -d .dynamo-frontend/dynamo/frontend ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
    --target .dynamo-frontend ai-dynamo==1.6.1 pyyaml msgspec
fi

# Two pytest workers (pytest-xdist): most tests wait on server processes (start-up, sleeps) rather
# than the CPU, so two at a time on 2 cores take the main pass from ~31 to ~18 minutes.
# --dist loadfile: a file's tests run on one worker, in order, as they do without xdist: its
# module-scoped fixtures and servers start once, and no two tests of one file overlap. Each worker
# is a session of its own (its own session-scoped oracles). Arguments given after these win, e.g.
# `bash scripts/test.sh -n 0` runs in one process.
WORKERS=(-n 2 --dist loadfile)
.venv/bin/python -m pytest "${WORKERS[@]}" "$@"

# The differential suite once more through Dynamo's KServe frontend (--frontend dynamo, via
# DYN_BRIDGE_FRONTEND, which every bridge the harness starts inherits): there it must match
# Triton except for the named differences of tests/differential/support.py
# (DYNAMO_FRONTEND_DIFFERENCES, docs/frontend_differences.md). The HTTP differential tests are
# left out here: they always start the triton door (its HTTP wire; Dynamo's frontend has none),
# so the first pass already ran them exactly so.
# Beside it, Triton's qa bls_memory tests (1 GiB tensors through BLS, ~7 GB resident, a few
# minutes): a step of their own, so that the main pass keeps its memory small; one case at a time
# (their memory is the point), their output printed after the dynamo pass's. Side by side the two
# took 5:49 where one after the other take ~7:20 (4:52 + 2:26; ~14 GB used at most).
# With them, qa/L0_backend_python/model_readiness's case of over a minute (~1.5 minutes); and
# beside all, qa/L0_simple_ensemble's two EnsembleBackpressureTest cases of minutes (~4.5
# minutes): their models' sleeps, hardly any CPU.
# All are skipped when pytest was given a selection.
if [ "$#" -eq 0 ] || [ "$*" = "-p no:cacheprovider" ]; then
  heavy_log=$(mktemp)
  DYN_BRIDGE_UPSTREAM_HEAVY=1 .venv/bin/python -m pytest "$@" \
    tests/upstream/test_qa_backend_python.py -k "bls_memory or (model_readiness and minutes)" \
    >"$heavy_log" 2>&1 &
  heavy=$!
  slow_log=$(mktemp)
  DYN_BRIDGE_UPSTREAM_HEAVY=1 .venv/bin/python -m pytest "$@" \
    tests/upstream/test_qa_backend_python.py -k "EnsembleBackpressureTest and minutes" \
    >"$slow_log" 2>&1 &
  slow=$!
  dynamo_status=0
  DYN_BRIDGE_FRONTEND=dynamo .venv/bin/python -m pytest "${WORKERS[@]}" "$@" tests/differential \
    --ignore-glob='tests/differential/test_diff_http*' || dynamo_status=$?
  heavy_status=0
  wait "$heavy" || heavy_status=$?
  slow_status=0
  wait "$slow" || slow_status=$?
  echo "== tests/upstream/test_qa_backend_python.py -k 'bls_memory or (model_readiness and" \
    "minutes)' (DYN_BRIDGE_UPSTREAM_HEAVY=1)"
  cat "$heavy_log"
  echo "== tests/upstream/test_qa_backend_python.py -k 'EnsembleBackpressureTest and minutes'"
  cat "$slow_log"
  rm -f "$heavy_log" "$slow_log"
  if [ "$dynamo_status" -ne 0 ]; then exit "$dynamo_status"; fi
  if [ "$heavy_status" -ne 0 ]; then exit "$heavy_status"; fi
  if [ "$slow_status" -ne 0 ]; then exit "$slow_status"; fi
fi

# The product must work with numpy 1.x too (a repository's models may pin it): the in-process
# unit tests once more against numpy < 2. Skipped when pytest was given a selection.
if [ "$#" -eq 0 ] || [ "$*" = "-p no:cacheprovider" ]; then
  if [ ! -x .venv-numpy1/bin/python ]; then "$PYTHON" -m venv .venv-numpy1; fi
  .venv-numpy1/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]" "numpy<2"
  .venv-numpy1/bin/python -m pytest "${WORKERS[@]}" "$@" tests/unit
fi
