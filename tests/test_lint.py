"""The repository's lint (ruff.toml): pyflakes and pycodestyle errors everywhere, and lines within
100 characters in the core files a reader goes through. Installed by `install.sh dev`; a machine
without ruff (a GPU image with no network) skips this file."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("ruff")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_finds_nothing():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format=concise", "."],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_core_is_held_to_100_columns():
    # the setting itself: a core file with a long line fails, a support file's passes
    long = "x = 1  # " + "a" * 100 + "\n"
    for name, fails in (("train.py", True), ("triton_ops.py", False)):
        out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--stdin-filename", name, "-"],
                             cwd=ROOT, input=long, capture_output=True, text=True)
        assert (out.returncode != 0) == fails, out.stdout
