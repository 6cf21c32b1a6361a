"""The README's quick start runs as written: its TOML block as generator.toml, then its Python
block, in a fresh directory."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def blocks(language: str) -> list:  # type: ignore[type-arg]
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_quick_start_runs(tmp_path: pathlib.Path) -> None:
    (toml,) = blocks("toml")
    (python,) = blocks("python")
    assert len(python.strip().splitlines()) == 3, "a three-line quick start"
    (tmp_path / "generator.toml").write_text(toml, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-c", python], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    assert run.returncode == 0, run.stderr
    number, created_at = run.stdout.split(maxsplit=1)
    assert int(number) > 0 and re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d.*\+00:00", created_at), run.stdout
