"""The README's quick starts run as written: its TOML block as generator.toml, then each Python
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


def test_the_quick_starts_run(tmp_path: pathlib.Path) -> None:
    (toml,) = blocks("toml")
    threaded, in_asyncio = blocks("python")
    assert len(threaded.strip().splitlines()) == 3, "a three-line quick start"
    (tmp_path / "generator.toml").write_text(toml, encoding="utf-8")
    for python in (threaded, in_asyncio):
        run = subprocess.run(
            [sys.executable, "-c", python], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=dict(os.environ)
        )
        assert run.returncode == 0, run.stderr
        if python is threaded:
            number, created_at = run.stdout.split(maxsplit=1)
            assert int(number) > 0 and re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d.*\+00:00", created_at), run.stdout
        else:
            assert int(run.stdout) > 0, run.stdout
