"""Shared fixtures: the offline teacher and its tokenizer are loaded once per test session."""

import importlib
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():  # the Triton kernels run in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def register_extra_mixers(modules):
    """Add the LAYERS of each module named in `modules` (comma-separated, modules of tests/) to
    mixers' registry for this run, before any test module reads it (tests/test_registry.py)."""
    import mixers

    for name in filter(None, modules.split(",")):
        for cls in importlib.import_module(name).LAYERS:
            mixers.LAYERS[cls.name] = cls
            mixers.FAMILY[cls.name] = (cls.family, cls.decay)
    mixers.MIXERS = tuple(mixers.LAYERS)


register_extra_mixers(os.environ.get("LINEARIZE_EXTRA_MIXERS", ""))

# pytest.ini spreads the test files over one process a core (pytest-xdist's -n auto, a file's tests
# together so that its module fixtures are built once): each process takes its share of the cores
torch.set_num_threads(max(1, min(4, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))


@pytest.fixture(scope="session")
def teacher():
    import checkpoint

    return checkpoint.load("default").eval()


@pytest.fixture(scope="session")
def tok():
    import checkpoint

    return checkpoint.load_tokenizer("default")
