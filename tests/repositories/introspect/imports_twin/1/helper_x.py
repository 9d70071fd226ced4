"""A helper module beside model.py; it imports pb_utils at import time, as helpers often do."""

import triton_python_backend_utils as pb_utils

VALUE = "imports_twin helper_x"


def describe():
    # Touch pb_utils at call time too: the classes must be there inside the model process.
    return "imports_twin helper_x sees pb_utils.Tensor: " + str(hasattr(pb_utils, "Tensor"))
