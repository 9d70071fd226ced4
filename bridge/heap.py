"""Keep Python's cyclic garbage collector off the long-lived heap.

After start-up the process holds tens of thousands of long-lived objects: Dynamo's and protobuf's
modules, the models and their weights. Every full collection walks all of them with the GIL held,
which stalls the runtime's threads in the middle of requests. Freezing them once they are loaded
(`gc.freeze`) leaves the collector only the objects requests create.

A frozen object is never collected, so when a model generation is retired its frozen part would
stay in memory for good: `refreeze()` after unloads puts the frozen objects back, collects what
is garbage now, and freezes what is left. It is a full collection and holds the GIL whatever
thread runs it, so the manager runs it once, shortly after the last unload of a burst
(manager.REFREEZE_DELAY), not once per unload. Frozen objects that are not in a cycle (a
model's arrays, usually) are freed by reference counting as soon as the generation is dropped.
"""

from __future__ import annotations

import gc


def freeze() -> None:
    """Collect once, then exempt everything alive now from later collections."""
    gc.collect()
    gc.freeze()


def refreeze() -> None:
    """After a model is unloaded: free its frozen objects, then freeze the live heap again."""
    gc.unfreeze()
    freeze()
