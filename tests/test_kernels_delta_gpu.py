"""The claims of test_kernels_delta.py on a GPU, compiled: larger shapes in fp32 and in bf16 at
fla's tolerances, and 65k tokens with extreme gates. A file of its own so that, on a GPU machine,
another test process compiles these kernel variants while the small claims' run (pytest.ini
keeps a file's tests in one process, and compiling is most of these files' time there). KDA's
per-channel gates compile kernels of their own, about as many again: test_kernels_kda_gpu.py
checks them, in a process of its own.
"""
import os

import pytest
import torch

from test_kernels_delta import check_against_recurrence, make_inputs

import triton_ops

CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"  # compiled kernels

# --- the same claims on a GPU, compiled kernels ---------------------------------------------

# fla's acceptance levels for half-precision inputs: its assert_close ratios, RMS error over
# the reference's RMS (0.005 o and ht, 0.008 dq dk dv dh0, 0.02 dg and dbeta); rel() is that ratio
GPU_TOL = {"o": 0.005, "ht": 0.005, "grad": 0.008, "dg": 0.02, "dbeta": 0.02}
# fp32 inputs: the kernels switch their products to exact fp32 (tf32 gave 1.5e-3 to 2.5e-3)
GPU_TOL_FP32 = {"o": 1e-4, "ht": 1e-4, "grad": 1e-4}


def gpu_claims(gates, gate_65k):
    """This file's two tests, for the gates `gates` and, over 65k tokens, gate_65k: a test module
    assigns them to names of its own, and pytest runs them in that module's process."""
    gpu = pytest.mark.skipif(not CUDA, reason="needs a GPU and compiled Triton")

    @gpu
    @pytest.mark.parametrize("gate", gates)
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def matches_recurrence(gate, dtype):
        tol = GPU_TOL if dtype == torch.bfloat16 else GPU_TOL_FP32
        check_against_recurrence(gate, 2, 1000, 4, 64, 64, True, "cuda", dtype, tol)
        check_against_recurrence(gate, 1, 300, 2, 128, 128, True, "cuda", dtype, tol)

    @gpu
    def extreme_gates_finite():
        # gates from 1e-4 to 1e3 times the usual logsigmoid scale, over 65536 tokens
        B, T, H, D = 1, 65536, 2, 64
        (q, k, v), beta, g, h0 = make_inputs(gate_65k, B, T, H, D, D, "cuda", torch.bfloat16)
        g = g * torch.logspace(-4, 3, g.numel(), device="cuda").reshape(g.shape)
        leaves = [x.requires_grad_(True) for x in (q, k, v, beta, g, h0)]
        o, ht = triton_ops.chunk_delta_rule(*leaves)
        (o.float().square().mean() + ht.square().mean()).backward()
        for x in [o, ht] + [x.grad for x in leaves]:
            assert torch.isfinite(x).all()

    return matches_recurrence, extreme_gates_finite


# DeltaNet and Gated DeltaNet
test_matches_recurrence_cuda, test_65k_tokens_extreme_gates_finite_cuda = gpu_claims(["none", "head"], "head")
