"""The README's guard example runs as written."""

from documents import blocks


def test_the_readme_guard_example_runs(tmp_path, monkeypatch, capsys):
    [block] = [b for b in blocks("py") if "Guard(model, optimizer" in b]
    monkeypatch.chdir(tmp_path)  # its checkpoint_dir is relative
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    level, skipped, name = capsys.readouterr().out.split()
    assert level in {"ok", "watch", "warn", "critical"} and int(skipped) >= 0
    assert (tmp_path / "ckpt" / name).exists()
    assert list((tmp_path / "ckpt").glob("guard-*.pt"))  # healthy checkpoints were written
