"""test_kernels_delta_gpu.py's claims for KDA's per-channel gates (unbounded, and bounded as KDA
runs them): their kernels are compiled variants of their own, so on a GPU machine this file's
process compiles them while the per-head gates' compile in that file's.
"""
from test_kernels_delta_gpu import gpu_claims

test_matches_recurrence_cuda, test_65k_tokens_extreme_gates_finite_cuda = gpu_claims(["channel", "bounded"], "channel")
