"""The host's time to issue small GPU work, on the machine that ran this folder's rows.

python host_launch.py  (on a GPU machine; prints microseconds of host time a call, three rounds)
"""
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _copy(a, b, c, d, e, f, g, h, n, s1, s2, s3, s4,
          B0: tl.constexpr, B1: tl.constexpr, B2: tl.constexpr):
    i = tl.program_id(0)  # thirteen arguments and three constants, as the delta rule's kernels have
    tl.store(a + i, tl.load(b + i))


x, y = torch.zeros(1024, device="cuda"), torch.ones(1024, device="cuda")
args = (x, y, x, y, x, y, x, y, 1024, 1, 2, 3, 4)
for _ in range(10):
    _copy[(4,)](*args, B0=16, B1=32, B2=64)
torch.cuda.synchronize()
for _ in range(3):
    t = time.perf_counter()
    for _ in range(2000):
        _copy[(4,)](*args, B0=16, B1=32, B2=64)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"triton launch: {(t1 - t) / 2000 * 1e6:.1f} us host each")
    t = time.perf_counter()
    for _ in range(2000):
        torch.add(x, y, out=x)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"torch.add: {(t1 - t) / 2000 * 1e6:.1f} us host each")
    a = torch.randn(64, 64, device="cuda", requires_grad=True)
    t = time.perf_counter()
    for _ in range(500):
        (a * 2).sum().backward()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"tiny fwd+bwd (mul, sum, backward): {(t1 - t) / 500 * 1e6:.1f} us host each")
