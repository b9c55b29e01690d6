"""Tests of the kiln Python client (stdlib unittest only).

Run from the repository root, either way:

    python3 -m unittest discover -s sdk/python/tests -t sdk/python -v
    python3 -m unittest discover -s sdk/python/tests -v
"""

import os
import sys

# The modules import their helpers (harness, fake_kilnd) by plain name in both layouts.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import faulthandler as _faulthandler
import os as _os

# A hung test should fail loudly with every thread's traceback rather than stall the
# whole suite: after KILN_PY_TEST_DEADLINE seconds (default 900) dump and exit.
_faulthandler.dump_traceback_later(int(_os.environ.get("KILN_PY_TEST_DEADLINE", "900")), exit=True)
