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
