"""The tests follow mixers' registry: a mixer registered for one run (tests/throwaway_mixer.py,
Mamba-2's recurrence, through LINEARIZE_EXTRA_MIXERS and conftest.py) goes through the whole
ladder with no test edited: its textbook recurrence against its family's token loop, chunked
form and one-token step, state hand-over and gradients, its layer's prefill and decoding, the
naive and torch backends, and the Triton kernels (here in the interpreter)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# each one runs on the new mixer; every other test that takes it from the registry may run too
LADDER = {
    "test_mixers.py": ["test_chunked_equals_recurrent", "test_textbook_recurrence_equals_family",
                       "test_state_hand_over", "test_extreme_gates_stay_finite",
                       "test_layer_prefill_then_decode_equals_forward",
                       "test_layer_naive_equals_chunked", "test_student_from_teacher_trains"],
    "test_kernels_glue.py": ["test_mixer_layers_give_the_same_on_the_kernel_path",
                             "test_layer_prefill_then_decode_on_the_kernel_path",
                             "test_layer_heads_keep_the_tail_for_decoding",
                             "test_in_projection_pads_rows_and_changes_nothing"],
}


def test_a_registered_mixer_runs_the_whole_ladder():
    # in one process (-n 0), the new mixer's tests only
    cmd = [sys.executable, "-m", "pytest", *(os.path.join("tests", f) for f in LADDER), "-n", "0", "-v",
           "-p", "no:cacheprovider", "-k", "mamba2 and not mamba2s"]
    env = {**os.environ, "LINEARIZE_EXTRA_MIXERS": "throwaway_mixer"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    passed = set(re.findall(r"::(\w+)\[mamba2[^\]]*\] PASSED", proc.stdout))
    summary = proc.stdout[proc.stdout.rfind("short test summary"):] + proc.stderr[-2000:]  # names, no tensors
    assert proc.returncode == 0, summary
    assert passed >= {name for names in LADDER.values() for name in names}, summary


def test_bench_names_a_mixer_it_has_no_peer_for():
    bench = pytest.importorskip("bench")  # triton.testing, and a CUDA GPU only for its timings
    label, fn, why = bench.peer("mamba2")
    assert fn is None and label == "no peer for mamba2" and why
