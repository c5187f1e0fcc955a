"""Shared fixtures: the offline teacher and its tokenizer, loaded once per test session, and the
inputs of a tiny reproduce.py run."""

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


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory):
    """The inputs of a tiny reproduce.py run, one set a test file (tests/test_reproduce.py,
    tests/test_long_context.py): a 2-layer teacher (the real vocabulary: the tasks and NIAH use
    the real tokenizer), random corpora and tasks, and the run's settings on them: (folder,
    reproduce.py's arguments)."""
    import json

    import numpy as np

    import checkpoint
    import model as M

    d = tmp_path_factory.mktemp("reproduce")
    torch.manual_seed(0)
    cfg = M.Config(n_layer=2, n_embd=64, n_head=2, n_kv_head=1, intermediate_size=128)
    checkpoint.save(str(d / "t.pt"), M.SmolLM2(cfg))
    rng = np.random.default_rng(0)
    for name, chat in (("text", False), ("chat", True)):
        os.makedirs(d / name)
        for split in ("train", "val"):
            rng.integers(17, 49152, 20_000).astype(np.uint16).tofile(d / name / f"{split}.bin")
            if chat:  # the assistant's tokens: every other run of 50
                ((np.arange(20_000) // 50) % 2).astype(np.uint8).tofile(d / name / f"{split}_mask.bin")
    os.makedirs(d / "mc")
    for task in ("arc_easy", "piqa"):
        qs = [{"id": i, "requests": [[f"Question {i}:", " yes"], [f"Question {i}:", " no"]], "gold": i % 2} for i in range(4)]
        (d / "mc" / f"{task}.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    t = d / "t.pt"
    args = ["--mixer=gla", "--tokens=4k", "--sft_tokens=128", "--mc_limit=2", "--tasks=arc_easy,piqa",
            f"--text={d / 'text'}", f"--chat={d / 'chat'}", f"--val={d / 'text' / 'val.bin'}",
            f"--niah=--tasks=s_niah_1 --lengths=128 --samples=1 --depths=50 --batch_size=1 --data={d / 'text' / 'val.bin'}",
            f"--eval_extra=--teacher={t} --mc_dir={d / 'mc'} --max_windows=1 --seq_len=64 --batch_size=2",
            f"--extra=--teacher={t} --block_size=64 --batch_size=1 --eval_iters=1 --log_interval=10",
            "--maturity=0.25", "--maturity_tasks=piqa", "--sft_kd",
            f"--maturity_niah=--tasks=s_niah_1 --lengths=128 --samples=1 --depths=50 --batch_size=1 --data={d / 'text' / 'val.bin'}",
            f"--work={d / 'work'}", f"--results={d / 'results'}"]
    return d, args
