"""test_kernels_delta_gpu.py's claims for KDA's per-channel gates (unbounded, and bounded as KDA
runs them): their kernels are compiled variants of their own, so on a GPU machine this file's
process compiles them while the per-head gates' compile in that file's.
"""
import pytest

from test_kernels_delta_gpu import CUDA, DTYPES, check_65k_tokens_finite, check_on_gpu


@pytest.mark.skipif(not CUDA, reason="needs a GPU and compiled Triton")
@pytest.mark.parametrize("gate", ["channel", "bounded"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_recurrence_cuda(gate, dtype):
    check_on_gpu(gate, dtype)


@pytest.mark.skipif(not CUDA, reason="needs a GPU and compiled Triton")
def test_65k_tokens_extreme_gates_finite_cuda():
    check_65k_tokens_finite("channel")
