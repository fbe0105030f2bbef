"""Set-up of the integration tests: no ``datasets`` package made of the tests' own folder,
and, under CI, both frameworks required (their tests skip where an extra is missing).

The root conftest puts ``tests/`` on ``sys.path`` (test folders are not packages), so with
Hugging Face's ``datasets`` not installed, ``import datasets`` finds ``tests/datasets`` as
a namespace package; transformers then takes it for the real one and the Trainer fails on
``datasets.Dataset``. Marking the name as absent before transformers is first imported
makes transformers see what is true: no ``datasets`` installed.
"""

import importlib.util
import os
import sys

_spec = importlib.util.find_spec("datasets")
if _spec is not None and _spec.origin is None:  # a namespace package: a folder, no code
    sys.modules["datasets"] = None

if os.environ.get("CI"):  # CI installs both extras (make install): there, a missing one
    # must fail the run, not skip its tests quietly
    import accelerate  # noqa: F401
    import lightning.pytorch  # noqa: F401
    import transformers  # noqa: F401
