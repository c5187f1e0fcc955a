"""The delta-rule kernels that walk the chunks fit an H100/H200's shared memory in fp32 at Dk = 128.

A GPU refuses a launch that needs more than 227 KB of shared memory per block, and Triton's CPU
interpreter never notices. scripts/kernel_smem.py records the launches in the interpreter and
compiles them offline for sm_90 (no GPU needed); the full sweep takes many minutes on a CPU, so
this test takes the kernels and the case that once did not fit: the two sequential kernels at
Dk = Dv = 128 in fp32, whose prefetched chunk tiles needed 240 KB at three pipeline stages.
"""

import copy
import importlib.util
import os

import pytest

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter only: records launches through Triton's interpreter (TRITON_INTERPRET=1, which "
                "conftest.py sets without a GPU)", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("kernel_smem", os.path.join(ROOT, "scripts", "kernel_smem.py"))
kernel_smem = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel_smem)


@pytest.fixture(scope="module")
def sequential():
    """The launches of the two sequential kernels in fp32 at Dk = Dv = 128, recorded once."""
    return kernel_smem.launches(dtypes=["fp32"], dims=[128], families=["delta"],
                                kernels={"_delta_fwd_h_kernel", "_delta_bwd_dh_kernel"})


def test_sequential_delta_kernels_fit_sm90_shared_memory_in_fp32(sequential):
    found = copy.deepcopy(sequential)
    assert {name for name, *_ in found} == {"_delta_fwd_h_kernel", "_delta_bwd_dh_kernel"}
    rows = kernel_smem.compile_all(found, jobs=2)
    assert len(rows) >= 6  # two kernels x three gate granularities
    assert all(r[3] > 0 for r in rows)
    over = [r for r in rows if r[3] > kernel_smem.SM90_SHARED]
    assert not over, over


def test_the_check_sees_a_launch_that_does_not_fit(sequential):
    # the same kernels at three pipeline stages are over the limit: the measurement can fail
    found = [launch for launch in copy.deepcopy(sequential) if launch[0] == "_delta_bwd_dh_kernel"]
    for _, _, opts in found:
        opts["num_stages"] = 3
    rows = kernel_smem.compile_all(found[:1], jobs=1)
    assert rows[0][3] > kernel_smem.SM90_SHARED


def test_a_row_stride_that_divides_by_16_gives_wide_loads():
    # the short conv reads x as a slice of a wider projection: with rows 3 H D + 8 channels apart
    # (no multiple of 16) the compiled kernel falls back to 2-byte loads, with contiguous rows of
    # 3 H D = 384 channels it loads 16 bytes at a time; hence triton_ops.ROW_ALIGN
    found = kernel_smem.launches(dtypes=["bf16"], dims=[64], families=["glue"], kernels={"_conv_fwd_kernel"})
    rows = kernel_smem.compile_all(found, jobs=2)
    loads = sorted((r[4]["narrow"], r[4]["wide"]) for r in rows)
    assert len(loads) == 2 and loads[0][0] == 0 and loads[0][1] > 0 and loads[1][0] > 0, loads
    # and ptxas's count of each one's registers and spills came back (-1 where it printed none)
    assert all(0 < r[4]["regs"] <= 255 and r[4]["spills"] >= 0 for r in rows), [r[4] for r in rows]


def test_launches_recorded_without_running_them_are_those_a_run_makes():
    # kernel_smem records a launch and skips it (what compiles depends on the arguments, not on
    # what the tensors hold): the same launches, in the same order, as when every kernel runs
    kw = dict(dtypes=["fp32"], dims=[16], families=["delta", "glue"])
    recorded = kernel_smem.launches(**kw)
    assert len(recorded) > 40 and recorded == kernel_smem.launches(**kw, execute=True)
