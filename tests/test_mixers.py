"""mixers.py: chunked forms against the token-by-token recurrences (outputs, states, gradients),
state hand-over, closed forms, extreme gates, the layers' decoding cache, teacher-to-student init."""

import inspect
import math
import os

import pytest
import torch
import torch.nn.functional as F

import checkpoint
import mixers
import model

F64 = torch.float64


def family_inputs(mixer, B=2, T=37, H=2, Dk=16, Dv=8, dtype=F64, seed=0, decay=None):
    """Random inputs of the mixer's family form, all leaves that require grad.
    decay(shape) -> log decays; default: a spread of realistic values."""
    family, gran = mixers.FAMILY[mixer]
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    decay = decay or (lambda shape: F.logsigmoid(2 + 2 * rand(*shape)))
    x = dict(q=rand(B, T, H, Dk), k=rand(B, T, H, Dk), v=rand(B, T, H, Dv), h0=0.5 * rand(B, H, Dk, Dv))
    if family == "delta":  # unit keys: the delta rule is only stable for beta |k|^2 <= 2
        x["k"] = F.normalize(x["k"], dim=-1)
        x["beta"] = torch.sigmoid(rand(B, T, H))
    x["g"] = {None: None, "head_const": decay((H,)), "head": decay((B, T, H)), "channel": decay((B, T, H, Dk))}[gran]
    return {n: (t if t is None else t.detach().requires_grad_()) for n, t in x.items()}


def run(fn, x, **kw):
    """fn over family inputs -> (o, S)."""
    if "beta" in x:
        return fn(x["q"], x["k"], x["v"], x["beta"], x["g"], x["h0"], **kw)
    return fn(x["q"], x["k"], x["v"], x["g"], x["h0"], **kw)


def fns(mixer):
    if mixers.FAMILY[mixer][0] == "delta":
        return mixers.chunk_delta_rule, mixers.recurrent_delta_rule, mixers.recurrent_step_delta_rule
    return mixers.chunk_decay_additive, mixers.recurrent_decay_additive, mixers.recurrent_step_decay_additive


def outputs_and_grads(o, S, x, seed=1):
    """o, S and the gradients of every input under a fixed random projection of both."""
    gen = torch.Generator().manual_seed(seed)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum()
    loss = loss + (S * torch.randn(S.shape, generator=gen, dtype=S.dtype)).sum()
    leaves = {n: t for n, t in x.items() if t is not None and t.requires_grad}
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return {"o": o, "S": S, **{"d" + n: g for n, g in zip(leaves, grads)}}


def assert_close(a, b, rtol):
    for name in a:
        err = (a[name] - b[name]).norm() / b[name].norm().clamp(min=1e-30)
        assert err < rtol, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("chunk", [16, 32])
@pytest.mark.parametrize("mixer", mixers.MIXERS)
def test_chunked_equals_recurrent(mixer, chunk):
    """Output, final state and every gradient, T = 37 (not a chunk multiple), scale != 1."""
    chunked, recurrent, _ = fns(mixer)
    x = family_inputs(mixer)
    want = outputs_and_grads(*run(recurrent, x, scale=0.3), x)
    got = outputs_and_grads(*run(chunked, x, scale=0.3, chunk_size=chunk), x)
    assert set(got) >= {"o", "S", "dq", "dk", "dv", "dh0"}
    assert_close(got, want, 1e-10)


def textbook(mixer, x):
    """The mixer's own recurrence (its layer's `textbook`) on family inputs: beta and g where it
    takes them."""
    fn = mixers.LAYERS[mixer].textbook
    assert fn is not None, f"{mixer}: its layer names no textbook recurrence"
    params = inspect.signature(fn).parameters
    own = set(params) - {"q", "k", "v", "beta", "g", "initial_state", "scale"}
    assert not own, f"{mixer}: its textbook takes {sorted(own)}, which family inputs do not have"
    gates = {n: x[n] for n in ("beta", "g") if n in params}
    return fn(x["q"], x["k"], x["v"], **gates, initial_state=x["h0"])


@pytest.mark.parametrize("mixer", [m for m in mixers.MIXERS if m != "mlstm"])  # mLSTM's: the next test
def test_textbook_recurrence_equals_family(mixer):
    """Each mixer's textbook recurrence is its family's chunked form with the mapped decay."""
    x = family_inputs(mixer)
    if mixer == "retnet":  # its fixed decays gamma_h
        x["g"] = mixers.retnet_log_decay(2, F64)
    want = outputs_and_grads(*textbook(mixer, x), x)
    got = outputs_and_grads(*run(fns(mixer)[0], x, chunk_size=16), x)
    assert_close(got, want, 1e-10)


def mlstm_inputs(B=2, T=37, H=2, Dk=16, Dv=8, seed=0, spread=20.0):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    x = dict(q=rand(B, T, H, Dk), k=rand(B, T, H, Dk), v=rand(B, T, H, Dv),
             i_pre=mixers.softcap(spread * rand(B, T, H)), f_pre=mixers.softcap(3 + spread * rand(B, T, H)),
             h0=0.01 * rand(B, H, Dk, Dv + 1))
    return {n: t.detach().requires_grad_() for n, t in x.items()}


def test_mlstm_stabilized_recurrence_equals_family():
    """Running-max mLSTM == the fixed-stabilizer family form: outputs, state, gate gradients."""
    x = mlstm_inputs()
    args = [x[n] for n in ("q", "k", "v", "i_pre", "f_pre")]
    h, state = mixers.mlstm_recurrent(*args, mixers.mlstm_convert_state(x["h0"]))  # (C, n, m)
    want = outputs_and_grads(h, mixers.mlstm_convert_state(state), x)  # in the family's layout
    got = outputs_and_grads(*mixers.mlstm_family(*args, x["h0"]), x)
    assert_close(got, want, 1e-9)


def test_mlstm_closed_form():
    """h = (QK^T * D) V / max(|(QK^T * D) 1|, 1), D_ij = f_{j+1} ... f_i i_j: the parallel mLSTM."""
    x = {n: t.detach() for n, t in mlstm_inputs(B=1, T=29).items()}
    q, k, v, i_pre, f_pre = (x[n][0].transpose(0, 1) for n in ("q", "k", "v", "i_pre", "f_pre"))  # [H, T, ...]
    F_cum = F.logsigmoid(f_pre).cumsum(-1)  # [H, T]
    logD = F_cum[:, :, None] - F_cum[:, None, :] + i_pre[:, None, :]  # [H, T, T]
    mask = torch.ones(29, 29, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2)) * 16**-0.5 * torch.where(mask, logD, -math.inf).exp()
    want = (scores @ v) / scores.sum(-1, keepdim=True).abs().clamp(min=1)  # [H, T, Dv]
    h, _ = mixers.mlstm_family(x["q"], x["k"], x["v"], x["i_pre"], x["f_pre"])
    torch.testing.assert_close(h[0].transpose(0, 1), want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mixer", mixers.MIXERS)
def test_state_hand_over(mixer):
    """Whole sequence == first part, then the rest from its state == one token at a time."""
    chunked, _, step = fns(mixer)
    x = {n: (t if t is None else t.detach()) for n, t in family_inputs(mixer).items()}
    o, S = run(chunked, x, chunk_size=16)

    def part(sl):
        y = dict(x)
        for n in ("q", "k", "v", "beta"):
            if n in y:
                y[n] = x[n][:, sl]
        if x["g"] is not None and x["g"].dim() > 1:
            y["g"] = x["g"][:, sl]
        return y

    first, h = run(chunked, part(slice(0, 21)), chunk_size=16)
    rest = part(slice(21, None))
    rest["h0"] = h
    second, S2 = run(chunked, rest, chunk_size=16)
    torch.testing.assert_close(torch.cat([first, second], 1), o, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S2, S, rtol=1e-10, atol=1e-10)
    h, steps = x["h0"], []
    for t in range(o.shape[1]):
        y = part(slice(t, t + 1))
        y["h0"] = h
        ot, h = run(step, y)
        steps.append(ot)
    torch.testing.assert_close(torch.cat(steps, 1), o, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, S, rtol=1e-10, atol=1e-10)


def test_linear_attention_closed_form():
    x = {n: (t if t is None else t.detach()) for n, t in family_inputs("linear_attention").items()}
    q, k, v = x["q"], x["k"], x["v"]
    T = q.shape[1]
    scores = torch.einsum("bihd,bjhd->bhij", q, k) * 0.3 * torch.ones(T, T, dtype=F64).tril()
    want = torch.einsum("bhij,bjhd->bihd", scores, v)
    o, _ = mixers.chunk_decay_additive(q, k, v, scale=0.3, chunk_size=16)
    torch.testing.assert_close(o, want, rtol=1e-10, atol=1e-10)


def test_retnet_closed_form():
    """Retention: o = (QK^T * D) V with D_ij = gamma_h^(i-j) for j <= i."""
    x = {n: (t if t is None else t.detach()) for n, t in family_inputs("retnet", H=4).items()}
    q, k, v = x["q"], x["k"], x["v"]
    T = q.shape[1]
    gamma = 1 - 2.0 ** (-5 - torch.arange(4, dtype=F64))
    i = torch.arange(T, dtype=F64)
    D = torch.where(i[:, None] >= i, gamma[:, None, None] ** (i[:, None] - i), 0.0)  # [H, T, T]
    scores = torch.einsum("bihd,bjhd->bhij", q, k) * 16**-0.5 * D
    want = torch.einsum("bhij,bjhd->bihd", scores, v)
    o, _ = mixers.chunk_decay_additive(q, k, v, mixers.retnet_log_decay(4, F64), chunk_size=16)
    torch.testing.assert_close(o, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("g_kind", [None, "token", "channel"])
def test_delta_rule_recalls_and_overwrites(g_kind):
    """beta = 1, no decay in effect, orthonormal keys: reading key k_j returns its value exactly,
    and writing a key again replaces its value (an additive memory would return the sum)."""
    D, T = 16, 20
    keys = torch.linalg.qr(torch.randn(D, D, dtype=F64))[0].T  # rows orthonormal
    idx = torch.tensor(list(range(16)) + [3, 7, 3, 11])  # keys 3, 7, 11 are written again
    k = keys[idx][None, :, None, :]  # [1, T, 1, D]
    v = torch.randn(1, T, 1, 8, dtype=F64)
    g = {None: None, "token": torch.zeros(1, T, 1, dtype=F64), "channel": torch.zeros(1, T, 1, D, dtype=F64)}[g_kind]
    o, S = mixers.chunk_delta_rule(k, k, v, torch.ones(1, T, 1, dtype=F64), g, scale=1.0, chunk_size=16)
    torch.testing.assert_close(o, v, rtol=1e-10, atol=1e-10)  # each token reads what it just wrote
    last = {int(j): t for t, j in enumerate(idx)}  # key -> the position of its last write
    recalled = torch.einsum("kv,nk->nv", S[0, 0], keys)  # S^T k for every key [D, 8]
    torch.testing.assert_close(recalled, v[0, list(last.values()), 0][torch.argsort(torch.tensor(list(last)))])


@pytest.mark.parametrize("mixer", [m for m in mixers.MIXERS if mixers.FAMILY[m][1] == "channel"])
def test_fp32_under_autocast(mixer):
    """Under bf16 autocast the chunked form still computes in fp32 (same result as without)."""
    chunked = fns(mixer)[0]
    x = {n: (t if t is None else t.detach().float()) for n, t in family_inputs(mixer).items()}
    want = run(chunked, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = run(chunked, x)
    assert_close({"o": got[0], "S": got[1]}, {"o": want[0], "S": want[1]}, 1e-6)


@pytest.mark.parametrize("mixer", mixers.MIXERS)
def test_extreme_gates_stay_finite(mixer):
    """Decays near 0 (down to exp(-1000)) and near 1 (exp(-1e-7)) mixed per token and channel,
    4096 tokens, fp32: chunked forward and backward stay finite and match the recurrence."""
    chunked, recurrent, _ = fns(mixer)

    def decay(shape):  # one of three extremes per element
        choice = torch.randint(0, 3, shape, generator=torch.Generator().manual_seed(2))
        return torch.tensor([-1e-7, -20.0, -1000.0], dtype=torch.float32)[choice]

    x = family_inputs(mixer, B=1, T=4096, H=2, Dv=16, dtype=torch.float32, decay=decay)
    o, S = run(chunked, x)
    (o.sum() + S.sum()).backward()
    for name, t in [("o", o), ("S", S)] + [("d" + n, v.grad) for n, v in x.items() if v is not None]:
        assert torch.isfinite(t).all(), f"{name} has NaN or Inf"
    short = {n: (t if t is None or t.dim() == 1 or n == "h0" else t[:, :200]).detach() for n, t in x.items() if t is not None}
    short.setdefault("g", None)
    want, got = run(recurrent, short), run(chunked, short)
    assert_close({"o": got[0], "S": got[1]}, {"o": want[0], "S": want[1]}, 1e-5)


def test_mlstm_extreme_gates_stay_finite():
    """Gate pre-activations of +-1e4 (soft-capped to +-15) over 4096 tokens: the fixed stabilizer
    stays finite forward and backward in fp32, and accurate on a prefix."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, D = 1, 4096, 2, 16
    q, k, v = (torch.randn(B, T, H, D, generator=gen) for _ in range(3))
    pre = lambda: (1e4 * torch.randn(B, T, H, generator=gen)).requires_grad_()  # noqa: E731
    i_raw, f_raw = pre(), pre()
    h, S = mixers.mlstm_family(q, k, v, mixers.softcap(i_raw), mixers.softcap(f_raw))
    (h.sum() + S.sum()).backward()
    assert torch.isfinite(h).all() and torch.isfinite(S).all()
    assert torch.isfinite(i_raw.grad).all() and torch.isfinite(f_raw.grad).all()
    # accuracy on a prefix, against the running-max recurrence in float64 (outputs reach ~5e3 here:
    # a denominator below the floor multiplies the numerator by up to e^15)
    args = [t[:, :200].detach() for t in (q, k, v, mixers.softcap(i_raw), mixers.softcap(f_raw))]
    got, want = mixers.mlstm_family(*args)[0], mixers.mlstm_recurrent(*[t.double() for t in args])[0]
    assert_close({"h": got.double()}, {"h": want}, 1e-4)


# ---------------------------------------------------------------------------------------------
# Layers


def tiny_config(mixer="gla", **kw):
    return model.Config(vocab_size=64, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48,
                        mixer=mixer, **kw)


def tiny_layer(mixer, seed=0):
    """A float64 mixer layer with every parameter perturbed, so that no init hides a bug
    (an identity conv would hide a wrong conv cache)."""
    torch.manual_seed(seed)
    layer = mixers.LAYERS[mixer](tiny_config(mixer), 0).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return layer


def rope(T, start=0):
    cos, sin = model.rope_cos_sin(torch.arange(start, start + T), 8, 10000.0)
    return model.Rope(cos.double(), sin.double())


@pytest.mark.parametrize("mixer", mixers.MIXERS)
def test_layer_prefill_then_decode_equals_forward(mixer):
    layer = tiny_layer(mixer)
    x = torch.randn(2, 13, 32, dtype=F64)
    full = layer(x, rope(13))
    cache = {}
    out = [layer(x[:, :6], rope(6), cache)]
    shapes = {n: t.shape for n, t in cache.items()}
    assert set(shapes) == {"state", "conv"}
    for t in range(6, 13):
        out.append(layer(x[:, t : t + 1], rope(1, t), cache))
        assert {n: t.shape for n, t in cache.items()} == shapes  # memory does not grow
    torch.testing.assert_close(torch.cat(out, 1), full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("mixer", mixers.MIXERS)
def test_layer_naive_equals_chunked(mixer):
    """The layer's gates map onto its family form: backend naive (textbook loop) == torch
    (chunked, then the one-token step), prefill and decode."""
    layer = tiny_layer(mixer, seed=1)
    x = torch.randn(2, 19, 32, dtype=F64)
    out = {}
    for naive in (False, True):
        layer.backend = "naive" if naive else "torch"
        cache = {}
        out[naive] = torch.cat([layer(x[:, :18], rope(18), cache), layer(x[:, 18:], rope(1, 18), cache)], 1)
    torch.testing.assert_close(out[True], out[False], rtol=1e-9, atol=1e-9)


def test_init_from_attention_head_mapping():
    """Student head h gets teacher KV head h // n_rep (n_head 6, n_kv_head 2, n_rep 3)."""
    config = model.Config(n_embd=48, n_head=6, n_kv_head=2, mixer="gated_deltanet")
    attn = model.Attention(config)
    layer = mixers.LAYERS["gated_deltanet"](config, 0)
    layer.init_from_attention(attn)
    D = config.head_dim
    q, k, v = layer.in_proj.weight[: 3 * 48].view(3, 48, 48)  # in_proj's first rows: q, k, v
    for name, w in (("k_proj", k), ("v_proj", v)):
        student, teacher = w.view(6, D, 48), getattr(attn, name).weight.view(2, D, 48)
        for h in range(6):
            assert torch.equal(student[h], teacher[h // 3]), f"{name} head {h}"
    assert torch.equal(q, attn.q_proj.weight)
    assert torch.equal(layer.o_proj.weight, attn.o_proj.weight)


@pytest.mark.parametrize("mixer", mixers.MIXERS)
def test_student_from_teacher_trains(mixer):
    """From a tiny random teacher: shared tensors copied, forward and backward finite."""
    torch.manual_seed(0)
    teacher = model.SmolLM2(tiny_config("attention"))
    student = checkpoint.student_from_teacher(teacher, mixer)
    own, theirs = student.state_dict(), teacher.state_dict()
    for key in ("model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight",
                "model.layers.0.input_layernorm.weight", "model.layers.1.self_attn.o_proj.weight"):
        assert torch.equal(own[key], theirs[key]), key
    q = own["model.layers.1.self_attn.in_proj.weight"][:32]  # in_proj's q rows
    assert torch.equal(q, theirs["model.layers.1.self_attn.q_proj.weight"])
    idx = torch.randint(0, 64, (2, 20))
    _, loss = student(idx, targets=idx)
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in student.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_hybrid_student_and_strict_copy():
    """Kept softmax layers copy as they are; a shape mismatch is an error, not a silent skip."""
    torch.manual_seed(0)
    teacher = model.SmolLM2(tiny_config("attention"))
    student = checkpoint.student_from_teacher(teacher, "kda", softmax_layers=(1,))
    assert isinstance(student.model.layers[1].self_attn, model.Attention)
    assert torch.equal(student.model.layers[1].self_attn.k_proj.weight, teacher.model.layers[1].self_attn.k_proj.weight)
    with pytest.raises(ValueError):
        checkpoint.student_from_teacher(teacher, "kda", intermediate_size=40)


def test_unknown_mixer_lists_valid_names():
    with pytest.raises(ValueError) as err:
        model.SmolLM2(tiny_config("lstm"))
    assert str(err.value).count("\n") == 0
    for name in model.MIXERS:
        assert name in str(err.value)


def test_registry_derives_from_the_layer_classes():
    # the study's seven are there (a test run may register more: test_registry.py)
    assert {"linear_attention", "retnet", "gla", "mlstm", "deltanet", "gated_deltanet", "kda"} <= set(mixers.MIXERS)
    assert mixers.MIXERS == tuple(mixers.LAYERS) and mixers.FAMILY.keys() == mixers.LAYERS.keys()
    for name, cls in mixers.LAYERS.items():
        assert cls.name == name and mixers.FAMILY[name] == (cls.family, cls.decay)
        assert cls.family in ("additive", "delta") and cls.decay in (None, "head_const", "head", "channel")


def test_a_bad_backend_is_a_one_line_error_before_any_work(monkeypatch):
    with pytest.raises(ValueError, match="valid backends: naive, torch, triton"):
        model.SmolLM2(tiny_config("gla")).set_backend("cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # triton runs on CUDA tensors only, then
    with pytest.raises(ValueError, match="use --backend=torch"):
        mixers.check_backend("triton", "cpu")
    layer = mixers.LAYERS["gla"](tiny_config("gla"), 0)
    layer.backend = "triton"
    with pytest.raises(ValueError, match="not on cpu"):  # never a silent fallback to PyTorch
        layer(torch.randn(1, 3, 32), rope(3))


def test_student_from_the_offline_teacher_trains(teacher):
    # the real 135M teacher: copied weights agree, and the student runs forward and backward
    student = checkpoint.student_from_teacher(teacher, "kda")
    t, s = teacher.state_dict(), student.state_dict()
    for key in ("model.embed_tokens.weight", "model.layers.7.mlp.up_proj.weight", "model.layers.7.self_attn.o_proj.weight"):
        assert torch.equal(t[key], s[key])
    k_t, k_s = t["model.layers.3.self_attn.k_proj.weight"], s["model.layers.3.self_attn.in_proj.weight"][576:1152]
    assert torch.equal(k_s[4 * 64:5 * 64], k_t[1 * 64:2 * 64])  # student head 4 reads KV head 4 // 3 = 1
    x = torch.randint(0, teacher.config.vocab_size, (1, 40))
    _, loss = student(x[:, :-1], targets=x[:, 1:])
    loss.backward()
    grads = [p.grad for p in student.parameters() if p.grad is not None]
    assert torch.isfinite(loss) and len(grads) > 0 and all(torch.isfinite(g).all() for g in grads)
    assert student.model.layers[3].self_attn.A_log.grad.abs().sum() > 0  # the new gates learn


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a GPU and compiled Triton")
@pytest.mark.parametrize("mixer", mixers.MIXERS)
def test_students_train_through_the_kernels_on_gpu(mixer, monkeypatch):
    # One student step (loss and every parameter gradient) four ways: the fp32 PyTorch chunked
    # forms are the reference; the kernels in fp32 (tf32 products in the additive family) agree
    # within 2%; under bf16 autocast the kernels are at most as far from the reference as the
    # PyTorch forms under the same autocast, within 1.25x plus 0.5% (both carry bf16 rounding
    # of a few percent on some gradients, so comparing them with each other proves little).
    # Parameters of a few entries (per-head gate biases) sum their gradient over every token, with
    # cancellation, and their bf16 error is noise of several percent either way: on the H200,
    # mLSTM's i_proj.bias was off by 1.5% and 9.7% (layers 0 and 1) for PyTorch bf16 and by 5.9%
    # and 9.7% for the kernels; in another run 7.5% against 12.6% in layer 1. For those the bound
    # is twice PyTorch's bf16 error plus 5%, at most 20%; the fp32 run above (2%) is the check
    # that the kernels compute the right gradient.
    import triton_ops

    torch.manual_seed(0)
    cfg = model.Config(vocab_size=512, n_layer=2, n_embd=256, n_head=4, n_kv_head=2, intermediate_size=512)
    student = checkpoint.student_from_teacher(model.SmolLM2(cfg), mixer).cuda()
    x = torch.randint(0, 512, (2, 300), device="cuda")
    dtypes = []
    for name in ("chunk_decay_additive", "chunk_delta_rule"):
        fn = getattr(triton_ops, name)
        monkeypatch.setattr(triton_ops, name, lambda q, *a, _fn=fn, **kw: dtypes.append(q.dtype) or _fn(q, *a, **kw))

    def step(use_kernels, bf16):
        student.set_backend("triton" if use_kernels else "torch")
        student.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            _, loss = student(x[:, :-1], targets=x[:, 1:])
        loss.backward()
        return loss.item(), {n: p.grad.float().clone() for n, p in student.named_parameters() if p.grad is not None}

    def errors(run, ref):
        (loss, grads), (loss_ref, grads_ref) = run, ref
        errs = {n: ((grads[n] - g).norm() / g.norm().clamp(min=1e-12)).item() for n, g in grads_ref.items()}
        return abs(loss - loss_ref) / abs(loss_ref), errs

    ref = step(False, False)
    assert not dtypes  # the reference never touched a kernel
    kern32 = errors(step(True, False), ref)
    assert dtypes == [torch.float32] * cfg.n_layer  # every layer went through a Triton kernel
    kern16 = errors(step(True, True), ref)
    assert dtypes[cfg.n_layer:] == [torch.bfloat16] * cfg.n_layer  # bf16 operands under autocast
    torch16 = errors(step(False, True), ref)
    assert kern32[0] < 1e-3 and kern16[0] < 1.25 * torch16[0] + 1e-3
    sizes = {n: p.numel() for n, p in student.named_parameters()}
    for n in ref[1]:
        assert kern32[1][n] < 0.02, f"{n}: fp32 kernels off by {kern32[1][n]:.4f}"
        limit = 1.25 * torch16[1][n] + 0.005
        if sizes[n] < 64:  # a few sums over all tokens
            limit = min(2 * torch16[1][n] + 0.05, 0.2)
        assert kern16[1][n] < limit, f"{n}: bf16 kernels off by {kern16[1][n]:.4f}, PyTorch bf16 by {torch16[1][n]:.4f}"


def test_kda_gate_is_bounded_and_starts_at_mamba2s_decay():
    # KDA's log decay GATE_MIN sigmoid(A (a + dt_bias)) stays in (GATE_MIN, 0) for any a, and for
    # a = 0 a new layer's is Mamba-2's -A dt, dt log-uniform in [1e-3, 1e-1], channel by channel
    torch.manual_seed(0)
    layer = mixers.LAYERS["kda"](model.Config(n_layer=1, vocab_size=64, mixer="kda"), 0)
    H, D = layer.n_head, layer.head_dim
    g0 = mixers.sigmoid_decay(torch.zeros(1, 1, H, D), layer.A_log, layer.dt_bias, mixers.GATE_MIN)
    dt = -g0 / layer.A_log.exp().view(H, 1)
    assert dt.min() >= 1e-3 * (1 - 1e-4) and dt.max() <= 1e-1 * (1 + 1e-4)
    assert dt.log().std() > 0.3 * (math.log(1e-1) - math.log(1e-3)) / math.sqrt(12)  # spread, not one value
    g = mixers.sigmoid_decay(1e3 * torch.randn(4, 8, H, D), layer.A_log, layer.dt_bias, mixers.GATE_MIN)
    assert (g >= mixers.GATE_MIN).all() and (g <= 0).all() and g.min() < 0.99 * mixers.GATE_MIN


@pytest.mark.parametrize("mixer", [m for m, c in mixers.LAYERS.items() if c.gate_min is not None])
def test_gates_keep_their_floor(mixer):
    # the layers' gates, fed pre-activations far past any trained value, never go below gate_min,
    # the bound they pass to the kernels
    torch.manual_seed(0)
    layer = mixers.LAYERS[mixer](model.Config(n_layer=1, vocab_size=64, mixer=mixer), 0)
    p = {n: 1e4 * torch.randn(2, 8, width) for n, width in layer.widths.items()}
    g = layer.gates(p, "torch")["g"]
    assert (g >= layer.gate_min).all() and (g == layer.gate_min).any()
