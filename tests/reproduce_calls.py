"""How the tests call scripts/reproduce.py: a run in a process of its own (run), or a refusal in
this one (refused), and the scripts folder on the import path (reproduce, report)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import reproduce  # noqa: E402


def run(args, **kw):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "reproduce.py")] + args,
                          cwd=ROOT, capture_output=True, text=True, **kw)


def refused(args):
    """reproduce.py's refusal of args, in this process: the message it exits with (one line)."""
    with pytest.raises(SystemExit) as e:
        reproduce.main(args)
    assert isinstance(e.value.code, str) and "\n" not in e.value.code.strip(), e.value.code
    return e.value.code.strip()
