"""The claims of test_kernels_additive.py on a GPU, compiled, in bf16 at larger shapes with fla's
tolerances, and 65k tokens with extreme gates. A file of its own so that, on a GPU machine,
another test process compiles these kernel variants while the small claims' run (pytest.ini
keeps a file's tests in one process, and compiling is most of these files' time there).
"""
import pytest
import torch

from test_kernels_additive import CUDA, check_against_recurrence, make_inputs

import triton_ops

GATES = ["none", "head_const", "head", "channel"]

# --- the same claims on a GPU, bf16, compiled kernels ------------------------------------

# fla's acceptance levels for half-precision inputs: the ratios of its tests' assert_close, RMS
# error over the reference's RMS (fla-org/flash-linear-attention, tests/ops/test_gated_delta.py:
# 0.005 for o and ht, 0.008 for dq dk dv dh0, 0.02 for dg and dbeta); rel() is that ratio
GPU_TOL = {"o": 0.005, "ht": 0.005, "grad": 0.008, "dg": 0.02}


@pytest.mark.skipif(not CUDA, reason="needs a GPU and compiled Triton")
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("T,D", [(1000, 64), (2048, 64), (1000, 128)])
def test_matches_recurrence_cuda_bf16(gate, T, D):
    check_against_recurrence(gate, 2, T, 4, D, D, 64, True, "cuda", torch.bfloat16, GPU_TOL)


@pytest.mark.skipif(not CUDA, reason="needs a GPU and compiled Triton")
def test_bounded_gates_match_recurrence_cuda_bf16():
    check_against_recurrence("channel", 2, 1000, 4, 64, 64, 64, True, "cuda", torch.bfloat16, GPU_TOL,
                             gate_min=-5.0)


@pytest.mark.skipif(not CUDA, reason="needs a GPU and compiled Triton")
@pytest.mark.parametrize("gate", ["head", "channel"])
def test_65k_tokens_extreme_gates_finite_cuda(gate):
    # gates from 1e-4 to 1e3 times the usual logsigmoid scale, over 65536 tokens
    B, T, H, D = 1, 65536, 2, 64
    (q, k, v), g, h0 = make_inputs(gate, B, T, H, D, D, "cuda", torch.bfloat16)
    g = g * torch.logspace(-4, 3, g.numel(), device="cuda").reshape(g.shape)
    leaves = [x.requires_grad_(True) for x in (q, k, v, g, h0)]
    o, ht = triton_ops.chunk_decay_additive(*leaves)
    (o.float().square().mean() + ht.square().mean()).backward()
    for x in [o, ht] + [x.grad for x in leaves]:
        assert torch.isfinite(x).all()
