"""The features part must import without torch (docs/design.md, "Layout")."""

import subprocess
import sys


def test_import_does_not_pull_torch():
    code = (
        "import sys, collapse_guard.features as f; "
        "f.FeatureExtractor().schema.fingerprint; "
        "heavy = [m for m in ('torch', 'lightgbm', 'sklearn') if m in sys.modules]; "
        "print(heavy)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
