"""Process-isolated model instances: one child Python process per instance, as Triton's stub.

`instance.py` is the parent's side (IsolatedInstance), `child.py` the process, `messages.py` what
they say to each other (typed messages), `bls_calls.py` the BLS calls a process's model makes, run
in the parent, and `tensors.py` how tensor data crosses (shared memory, not pickled lists).
"""

from .instance import IsolatedInstance

__all__ = ["IsolatedInstance"]
