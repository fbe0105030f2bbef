"""The README's guard example runs as written."""

import re
from pathlib import Path

from documents import blocks

from collapse_guard.guard import GuardPolicy


def test_the_readme_guard_example_runs(tmp_path, monkeypatch, capsys):
    [block] = [b for b in blocks("py") if "Guard(model, optimizer" in b]
    monkeypatch.chdir(tmp_path)  # its checkpoint_dir is relative
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    level, skipped, name = capsys.readouterr().out.split()
    assert level in {"ok", "watch", "warn", "critical"} and int(skipped) >= 0
    assert (tmp_path / "ckpt" / name).exists()
    assert list((tmp_path / "ckpt").glob("guard-*.pt"))  # healthy checkpoints were written


def test_the_readmes_data_fault_bound_is_the_policys():
    text = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    quoted = re.search(r"after (\d+) in a row stops with `GuardGaveUp` naming the data", text)
    assert quoted, "the README no longer quotes the data-fault bound"
    assert int(quoted.group(1)) == GuardPolicy().max_data_fault_skips


def test_the_readmes_rewind_gap_is_the_policys():
    text = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    quoted = re.search(r"the newest ([\d.]+) nats over the best one, `rewind_loss_gap`", text)
    assert quoted, "the README no longer quotes the rewind's gap"
    assert float(quoted.group(1)) == GuardPolicy().rewind_loss_gap
