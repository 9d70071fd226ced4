"""Process-isolated model instances: one child Python process per instance, as Triton's stub.

`instance.py` is the parent's side (IsolatedInstance), `child.py` the process, `messages.py` what
they say to each other, `tensors.py` how tensor data crosses (shared memory, not pickled lists).
"""

from .instance import IsolatedInstance

__all__ = ["IsolatedInstance"]
