"""Set-up of the integration tests: no ``datasets`` package made of the tests' own folder.

The root conftest puts ``tests/`` on ``sys.path`` (test folders are not packages), so with
Hugging Face's ``datasets`` not installed, ``import datasets`` finds ``tests/datasets`` as
a namespace package; transformers then takes it for the real one and the Trainer fails on
``datasets.Dataset``. Marking the name as absent before transformers is first imported
makes transformers see what is true: no ``datasets`` installed.
"""

import importlib.util
import sys

_spec = importlib.util.find_spec("datasets")
if _spec is not None and _spec.origin is None:  # a namespace package: a folder, no code
    sys.modules["datasets"] = None
