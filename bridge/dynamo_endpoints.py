"""Dynamo endpoint objects, made through one function that cannot wedge the process silently.

## Why (issue 39; the nats request plane only)

On the nats request plane, `DistributedRuntime.endpoint(path)` (ai-dynamo-runtime 1.6.1) waits
for Dynamo's runtime (the path's component and its NATS service) **while holding the GIL**.
Each of the runtime's worker threads that is completing a Python awaitable of Dynamo's (a
response item, a control answer, a request for a served model) waits for the GIL first. When
every worker thread is in that wait, nothing moves again: the process keeps its sockets open
and answers nothing, for good. gdb showed the main thread in `ComponentBuilder::build` ->
`block_in_place` and both tokio workers in `take_gil`; tests/e2e/test_nats_startup.py
reproduces it (16 streams in flight, 2 worker threads: at the first or second call, every time,
for a new component and for one the process already has). The tcp request plane never did.

What the bridge does about it:
- as few calls as it can: the door and BLS make the endpoint object of a model endpoint once,
  when an index round first names it (cluster/index.py), not on a request's path; a worker
  makes one per model generation;
- on nats, more runtime worker threads than awaitables likely to complete at once
  (bridge/tuning.py `runtime_threads`): that raises the bound, it does not remove it;
- every call goes through `dynamo_endpoint()`, which arms a watchdog that needs no GIL
  (`faulthandler`): a call that has not returned after WEDGED_S prints every thread's Python
  stack and ends the process with status 1, so a supervisor restarts it and the log says where
  it stopped, instead of a process that looks alive and serves nothing.
docs/deployment.md says to prefer the tcp request plane (Dynamo's default) for this reason.
"""

from __future__ import annotations

import faulthandler
import logging
import sys

from dynamo.runtime import DistributedRuntime, Endpoint

log = logging.getLogger("dynamo_bridge")

# A healthy call returns within one NATS round trip; one that takes this long is wedged.
WEDGED_S = 30.0


def dynamo_endpoint(runtime: DistributedRuntime, path: str) -> Endpoint:
    """`runtime.endpoint(path)`, ending the process with a stack dump if it wedges (see the
    module doc). Call it on one thread at a time (faulthandler has one timer per process)."""
    log.debug("making the Dynamo endpoint %s", path)
    faulthandler.dump_traceback_later(WEDGED_S, exit=True, file=sys.stderr)
    try:
        return runtime.endpoint(path)
    finally:
        faulthandler.cancel_dump_traceback_later()
