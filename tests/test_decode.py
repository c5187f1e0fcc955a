"""decode.py: decoding on static caches gives the plain loop's tokens and logits, for the
teacher, sliding-window attention (window inside and beyond the context), every student and a
hybrid, also with each block compiled; its buffers keep their shapes and storage from step to
step; on a GPU the same from a CUDA graph over the compiled blocks."""

import functools

import pytest
import torch

import checkpoint
import decode
import model as M

CUDA = torch.cuda.is_available()
CFG = dict(vocab_size=64, n_layer=2, n_embd=32, n_head=2, n_kv_head=1, intermediate_size=64)


@functools.lru_cache(maxsize=None)
def nets(device="cpu"):
    torch.manual_seed(0)
    teacher = M.SmolLM2(M.Config(**CFG))
    out = {"teacher": teacher}
    for m in M.MIXERS[1:]:
        out[m] = checkpoint.student_from_teacher(teacher, m, window=5) if m == "swa" else \
            checkpoint.student_from_teacher(teacher, m)
    out["swa, window past the context"] = checkpoint.student_from_teacher(teacher, "swa", window=64)
    out["hybrid"] = checkpoint.student_from_teacher(teacher, "gated_deltanet", softmax_layers=(1,))
    return {k: v.to(device).eval() for k, v in out.items()}


def plain_logits(net, idx, tokens):
    """The logits before each of tokens [B, n] through model.py's own caches (which grow)."""
    caches = [dict() for _ in net.model.layers]
    out = [net(idx, caches=caches, last_only=True)[:, -1]]
    for i in range(tokens.shape[1] - 1):
        out.append(net(tokens[:, i:i + 1], caches=caches, start=idx.shape[1] + i)[:, -1])
    return torch.stack(out, 1)


@torch.no_grad()
@pytest.mark.parametrize("name", list(nets()))
def test_static_caches_decode_as_the_plain_loop(name):
    net = nets()[name]
    idx = torch.randint(0, 64, (3, 7), generator=torch.Generator().manual_seed(1))
    want = torch.stack(list(decode.plain(net, idx, 12, temperature=0)), 1)
    got = torch.stack(list(decode.generate(net, idx, 12, temperature=0, static=True)), 1)
    assert torch.equal(got, want)
    dec = decode.Decoder(net, idx, 12, graph=False)
    logits = [dec.logits.clone()] + [dec.step(want[:, i]).clone() for i in range(11)]
    torch.testing.assert_close(torch.stack(logits, 1), plain_logits(net, idx, want), rtol=1e-5, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("name", ["teacher", "swa, window past the context", "gated_deltanet", "mlstm", "hybrid"])
def test_compiled_blocks_decode_as_the_plain_loop(name):
    # the GPU's default: each block through torch.compile (here its CPU code), the caches in place
    net = nets()[name]
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(2))
    want = torch.stack(list(decode.plain(net, idx, 8, temperature=0)), 1)
    dec = decode.Decoder(net, idx, 8, graph=False, compile=True)
    assert dec.block is not decode.block_step
    logits = [dec.logits.clone()] + [dec.step(want[:, i]).clone() for i in range(7)]
    torch.testing.assert_close(torch.stack(logits, 1), plain_logits(net, idx, want), rtol=1e-5, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("window", [0, 700])
def test_caches_longer_than_a_slice_of_slots_decode_as_the_plain_loop(window):
    # past decode.SLOTS slots the buffer is a whole number of slices, attended slice by slice; a
    # window's ring is then longer than the window, and here wraps around
    torch.manual_seed(0)
    teacher = M.SmolLM2(M.Config(**{**CFG, "n_layer": 1}))
    net = (checkpoint.student_from_teacher(teacher, "swa", window=window) if window else teacher).eval()
    idx = torch.randint(0, 64, (2, 1030), generator=torch.Generator().manual_seed(3))
    want = torch.stack(list(decode.plain(net, idx, 6, temperature=0)), 1)
    dec = decode.Decoder(net, idx, 6, graph=False)
    assert dec.caches[0]["k"].shape[2] == 2 * decode.SLOTS + 512 * (window == 0)  # 1036 or 700 slots rounded up
    logits = [dec.logits.clone()] + [dec.step(want[:, i]).clone() for i in range(5)]
    torch.testing.assert_close(torch.stack(logits, 1), plain_logits(net, idx, want), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_static_buffers_keep_their_storage_and_shapes():
    for name in ("teacher", "swa", "gated_deltanet"):
        net = nets()[name]
        dec = decode.Decoder(net, torch.zeros(2, 9, dtype=torch.long), 6, graph=False)
        before = [{k: (t.data_ptr(), t.shape) for k, t in c.items()} for c in dec.caches]
        for _ in range(5):
            dec.step(torch.ones(2, dtype=torch.long))
        assert [{k: (t.data_ptr(), t.shape) for k, t in c.items()} for c in dec.caches] == before
        assert dec.pos.item() == 14
        if name != "gated_deltanet":  # attention: a buffer of every position to come, or of the window
            assert dec.caches[0]["k"].shape[2] == (15 if name == "teacher" else 5)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@torch.no_grad()
@pytest.mark.parametrize("name", list(nets()))
def test_graphed_step_on_gpu_gives_the_plain_tokens(name):
    # fp32 on the GPU (bf16 ties could flip an argmax): the CUDA graph replays the static step
    net = nets("cuda")[name]
    idx = torch.randint(0, 64, (4, 33), generator=torch.Generator().manual_seed(1)).cuda()
    want = torch.stack(list(decode.plain(net, idx, 16, temperature=0)), 1)
    opts = decode.options("auto", idx.device)  # sample.py's and niah.py's default on CUDA
    dec = decode.Decoder(net, idx, 16, graph=opts["graph"], compile=opts["compile"])
    assert dec.graph is not None and dec.block is not decode.block_step  # graphed, blocks compiled
    got = torch.stack(list(decode.generate(net, idx, 16, temperature=0, **opts)), 1)
    assert torch.equal(got, want)
    logits = [dec.logits.clone()] + [dec.step(want[:, i]).clone() for i in range(15)]
    torch.testing.assert_close(torch.stack(logits, 1), plain_logits(net, idx, want), rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@torch.no_grad()
@pytest.mark.parametrize("window", [0, 700])
def test_static_attention_in_bf16_on_gpu_is_as_close_as_flash_attention(window):
    # bf16 as decoding runs: the static step's logits against the plain loop's (FlashAttention
    # over the growing cache), both against fp32
    torch.manual_seed(0)
    teacher = M.SmolLM2(M.Config(**{**CFG, "n_layer": 2, "vocab_size": 256}))
    net = (checkpoint.student_from_teacher(teacher, "swa", window=window) if window else teacher).cuda().eval()
    idx = torch.randint(0, 256, (2, 1030), generator=torch.Generator().manual_seed(3)).cuda()
    tokens = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(4)).cuda()
    exact = plain_logits(net, idx, tokens)
    net16 = net.to(torch.bfloat16)
    dec = decode.Decoder(net16, idx, 6, graph=True, compile=True)
    static = torch.stack([dec.logits.float()] + [dec.step(tokens[:, i]).float() for i in range(5)], 1)
    plain = plain_logits(net16, idx, tokens).float()
    err = lambda a: ((a - exact).norm() / exact.norm()).item()  # noqa: E731
    assert err(static) < 2 * err(plain) + 1e-3, (err(static), err(plain))
