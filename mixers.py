"""
The seven linear-time token mixers of the study, written as two families of matrix recurrences.

Every mixer keeps a state S [Dk, Dv] per head and reads it with the query, o_t = S_t^T (scale q_t).
They differ only in how S is written:

  decayed additive  S_t = exp(g_t) * S_{t-1} + k_t v_t^T
      linear_attention (no decay), retnet (fixed decay per head), mlstm (data-dependent decay
      per head; input gate folded into k, normalizer carried as an extra value column),
      gla (data-dependent decay per key channel)
  delta rule        S_t = exp(g_t) * S_{t-1};  S_t = S_t + beta_t k_t (v_t - S_t^T k_t)^T
      deltanet (no decay), gated_deltanet (decay per head), kda (decay per key channel)

Each recurrence comes in three forms: the recurrent form, token by token (sections 2 and 3);
the chunked form, parallel inside chunks of tokens and recurrent across them (training, prompts);
and the step, one token (decoding). A layer runs on one of three backends, its `backend`
(model.SmolLM2.set_backend, or --backend= on every script):
  "naive"   the recurrence as the mixer's textbook loop of section 2, the rest in PyTorch;
  "torch"   the family's chunked form and step of sections 3 and 4, all in PyTorch;
  "triton"  triton_ops.py's twins of the torch backend's functions (same names, same
            signatures), fused Triton kernels.
The default is triton for CUDA tensors and torch otherwise; asking for triton where it cannot
run is an error. The switch between them is section 1, in one place.

Inside, in reading order:
  1. the backends: the one switch between PyTorch and triton_ops.py (triton_twin);
  2. seven textbook recurrences, token by token in fp32, one per mixer (the ground truth);
  3. the two family recurrences: one-token steps (decoding) and their loops;
  4. the chunked form of both families (the algorithm triton_ops.py implements in Triton);
  5. what every mixer layer shares: the glue (input projection, short conv, L2 norm, output
     norm and gate) and MixerLayer, whose forward is the whole path of a layer;
  6. the seven mixer layers that model.py builds for a student, each beside the functions that
     make its gates, and the registry of the seven.

One layout everywhere: q, k [B, T, H, Dk], v [B, T, H, Dv], state [B, H, Dk, Dv] in fp32, and
every function returns (output, final_state). A log decay g <= 0 comes as None (no decay), [H]
(constant per head), [B, T, H] (per head and token) or [B, T, H, Dk] (per key channel).

References:
1) What Matters in Linearizing Language Models? arXiv 2504.14366 (the seven students, the setup)
2) Katharopoulos et al. 2020, Transformers are RNNs (linear attention)
3) Sun et al. 2023, Retentive Network (retnet)
4) Yang et al. 2024, Gated Linear Attention Transformers with Hardware-Efficient Training (gla;
   the chunked form with sub-chunks for per-channel decays)
5) Beck et al. 2024, xLSTM (mlstm, its stabilizer); xLSTM-7B (gate soft caps and inits)
6) Yang et al. 2024, Parallelizing Linear Transformers with the Delta Rule (deltanet; WY/UT form)
7) Yang et al. 2025, Gated Delta Networks (gated_deltanet; its A and dt inits from Mamba-2)
8) Kimi Team 2025, Kimi Linear (kda)
"""

import functools
import importlib.util
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

MLSTM_CAP = 15.0  # mLSTM gate pre-activations are soft-capped to (-15, 15); its fixed stabilizer
SUB = 16  # sub-chunk width for per-channel decays inside a chunk
# the floor of GLA's and KDA's per-step log decay (a per-token decay of at least exp(-5) = 0.0067):
# 15 steps then span at most 75 nats, inside fp32's exp, and the kernels take a diagonal sub-block
# of the chunk as one tensor-core product. From Kimi Linear's gate (fla's KDA safe_gate)
GATE_MIN = -5.0


def _fp32(fn):
    """Run fn with autocast off: under torch.autocast its matmuls would drop to bf16."""

    @functools.wraps(fn)
    def run(q, *args, **kwargs):
        with torch.autocast(q.device.type, enabled=False):
            return fn(q, *args, **kwargs)

    return run


def _prepare(q, k, v, initial_state, scale):
    """fp32 copies (float64 stays float64, for exact tests), the default scale, the start state."""
    dt = torch.promote_types(q.dtype, torch.float32)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    B, _, H, Dk = q.shape
    S = q.new_zeros(B, H, Dk, v.shape[-1]) if initial_state is None else initial_state.to(dt)
    return q, k, v, S, Dk**-0.5 if scale is None else scale


def _outer(a, b):  # a [B, H, Da], b [B, H, Db] -> a b^T [B, H, Da, Db]
    return a[..., :, None] * b[..., None, :]


def _read(S, q):  # S [B, H, Dk, Dv], q [B, H, Dk] -> S^T q [B, H, Dv]
    return (q[..., None, :] @ S)[..., 0, :]


# ---------------------------------------------------------------------------------------------
# 1. The backends, and the one switch between them.
# Every function that has a Triton twin in triton_ops.py (the same name, signature and result)
# is marked @triton_twin, which adds a keyword backend=: "triton" runs the twin, "naive" and
# "torch" run the PyTorch function itself. A layer resolves its backend once, at the top of
# MixerLayer.forward, and hands it to every call; "naive" differs from "torch" only in the
# recurrence (MixerLayer.recurrence runs the mixer's textbook loop).

BACKENDS = ("naive", "torch", "triton")
TWINS = {}  # name -> each function of this module that has a twin in triton_ops.py


def check_backend(backend, device=None):
    """backend (None: the default), or a one-line ValueError when it is unknown or cannot run on
    device; before any long work, so that a run never falls back to another backend silently."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if backend == "triton":
        if importlib.util.find_spec("triton") is None:
            raise ValueError("backend 'triton' needs the triton package (pip install triton)")
        on_gpu = device is None or str(device).startswith("cuda")
        if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"backend 'triton' runs on CUDA tensors (or with TRITON_INTERPRET=1 "
                             f"on the CPU), not on {device}; use --backend=torch")
    return backend


def resolve_backend(backend, x):
    """The backend that runs on tensors like x: backend itself, or for None the default, triton
    for CUDA tensors and torch otherwise. Triton off CUDA runs only in Triton's interpreter
    (TRITON_INTERPRET=1); elsewhere it is check_backend's one-line error."""
    backend = backend or ("triton" if x.is_cuda else "torch")
    if backend == "triton" and not x.is_cuda:
        check_backend(backend, x.device)
    return backend


def triton_twin(fn):
    """fn with a keyword backend= ("torch" if not given): "triton" runs triton_ops.<fn's name>
    on the same arguments instead (fused kernels), any other backend runs fn."""

    @functools.wraps(fn)
    def run(*args, backend="torch", **kwargs):
        if backend == "triton":
            import triton_ops  # only here: CPU runs never need triton

            return getattr(triton_ops, fn.__name__)(*args, **kwargs)
        return fn(*args, **kwargs)

    TWINS[fn.__name__] = run
    return run


# ---------------------------------------------------------------------------------------------
# 2. The seven textbook recurrences, as their papers write them, token by token in fp32.
# Gates arrive ready-made (the layers compute them); feature maps, norms and RoPE are applied
# by the layers too. These loops are what the chunked forms below are tested against.


@_fp32
def linear_attention_recurrent(q, k, v, initial_state=None, scale=None):
    """Linear attention: S_t = S_{t-1} + phi(k_t) v_t^T, o_t = S_t^T phi(q_t); q, k already
    mapped by phi."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    out = []
    for t in range(q.shape[1]):
        S = S + _outer(k[:, t], v[:, t])
        out.append(_read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


@_fp32
def retnet_recurrent(q, k, v, g, initial_state=None, scale=None):
    """RetNet: S_t = gamma_h S_{t-1} + k_t v_t^T, a fixed decay per head gamma_h = 1 - 2^(-5-h);
    g = log gamma [H] (retnet_log_decay). q, k carry RoPE."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    gamma = g.to(q.dtype).exp()  # [H]
    out = []
    for t in range(q.shape[1]):
        S = gamma[:, None, None] * S + _outer(k[:, t], v[:, t])
        out.append(_read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


@_fp32
def gla_recurrent(q, k, v, g, initial_state=None, scale=None):
    """GLA: S_t = Diag(a_t) S_{t-1} + k_t v_t^T, one decay a_t per key channel;
    g = log a [B, T, H, Dk]."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    a = g.to(q.dtype).exp()
    out = []
    for t in range(q.shape[1]):
        S = a[:, t, :, :, None] * S + _outer(k[:, t], v[:, t])  # Diag(a) scales the rows of S
        out.append(_read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


@_fp32
def mlstm_recurrent(q, k, v, i_pre, f_pre, initial_state=None, scale=None):
    """mLSTM as xLSTM writes it (Beck et al. 2024, section 2.3; C is stored transposed, [Dk, Dv],
    like every state here):
        C_t = f_t C_{t-1} + i_t k_t v_t^T,  n_t = f_t n_{t-1} + i_t k_t,
        h_t = C_t^T q_t / max(|n_t^T q_t|, 1),  f_t = sigmoid(f~_t),  i_t = exp(i~_t),
    with its stabilizer (the paper's appendix, and xLSTM's recurrent step): a running max
        m_t = max(log f_t + m_{t-1}, i~_t),  m_0 = 0,
    C and n kept times exp(-m_t), so that every factor below is <= 1, and the floor 1 of the
    denominator becomes exp(-m_t): the same h_t without overflow. i_pre, f_pre [B, T, H] are
    i~, f~. The state is xLSTM's (C [B, H, Dk, Dv], n [B, H, Dk], m [B, H]), C and n stabilized
    at m, zeros at the start; mlstm_convert_state turns it into mlstm_family's and back."""
    out_dtype = v.dtype
    q, k, v, _, scale = _prepare(q, k, v, None, scale)
    B, _, H, Dk = q.shape
    if initial_state is None:
        C, n, m = q.new_zeros(B, H, Dk, v.shape[-1]), q.new_zeros(B, H, Dk), q.new_zeros(B, H)
    else:
        C, n, m = (s.to(q.dtype) for s in initial_state)
    i_pre, f_pre = i_pre.to(q.dtype), f_pre.to(q.dtype)
    out = []
    for t in range(q.shape[1]):
        log_f = F.logsigmoid(f_pre[:, t])  # [B, H]
        m_new = torch.maximum(log_f + m, i_pre[:, t])
        f = torch.exp(log_f + m - m_new)[..., None]  # f_t exp(m_{t-1} - m_t) <= 1, [B, H, 1]
        i = torch.exp(i_pre[:, t] - m_new)[..., None]  # i_t exp(-m_t) <= 1
        C = f[..., None] * C + i[..., None] * _outer(k[:, t], v[:, t])
        n = f * n + i * k[:, t]
        qt = scale * q[:, t]
        den = (n * qt).sum(-1).abs().maximum(torch.exp(-m_new))  # [B, H]
        out.append(_read(C, qt) / den[..., None])
        m = m_new
    return torch.stack(out, 1).to(out_dtype), (C, n, m)


@_fp32
def deltanet_recurrent(q, k, v, beta, initial_state=None, scale=None):
    """DeltaNet: S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T; beta [B, T, H]."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    beta = beta.to(q.dtype)
    out = []
    for t in range(q.shape[1]):
        error = v[:, t] - _read(S, k[:, t])  # what the memory gets wrong about key k_t
        S = S + beta[:, t, :, None, None] * _outer(k[:, t], error)
        out.append(_read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


@_fp32
def gated_deltanet_recurrent(q, k, v, beta, g, initial_state=None, scale=None):
    """Gated DeltaNet: S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T;
    g = log a [B, T, H]."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    beta, a = beta.to(q.dtype), g.to(q.dtype).exp()
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    out = []
    for t in range(q.shape[1]):
        b = beta[:, t, :, None, None]  # [B, H, 1, 1]
        kk, kv = _outer(k[:, t], k[:, t]), _outer(k[:, t], v[:, t])
        S = a[:, t, :, None, None] * ((eye - b * kk) @ S) + b * kv
        out.append(_read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


@_fp32
def kda_recurrent(q, k, v, beta, g, initial_state=None, scale=None):
    """KDA: S_t = (I - beta_t k_t k_t^T) Diag(a_t) S_{t-1} + beta_t k_t v_t^T;
    g = log a [B, T, H, Dk]."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    beta, a = beta.to(q.dtype), g.to(q.dtype).exp()
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    out = []
    for t in range(q.shape[1]):
        b = beta[:, t, :, None, None]  # [B, H, 1, 1]
        kk, kv = _outer(k[:, t], k[:, t]), _outer(k[:, t], v[:, t])
        S = (eye - b * kk) @ (a[:, t, :, :, None] * S) + b * kv
        out.append(_read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


# ---------------------------------------------------------------------------------------------
# 3. The two families, one token at a time: the decoding steps and their loops.


def _log_decay(g, q):
    """A log decay of any granularity as [B, T, H, 1] (one per head) or [B, T, H, Dk] (one per
    channel)."""
    B, T, H, _ = q.shape
    if g is None:
        return q.new_zeros(B, T, H, 1)  # no decay: exp(0) = 1
    g = g.to(q.dtype)
    if g.dim() == 1:
        return g.view(1, 1, H, 1).expand(B, T, H, 1)  # constant per head
    return g[..., None] if g.dim() == 3 else g


def _at(g, t):  # the log decay of token t, keeping the time axis (T = 1)
    return g if g is None or g.dim() == 1 else g[:, t : t + 1]


@_fp32
def _step(q, k, v, beta, g, initial_state, scale):
    """One token of either family (beta=None: decayed additive). q, k, v [B, 1, H, D]."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    q, k, v = q[:, 0], k[:, 0], v[:, 0]  # [B, H, D]
    S = _log_decay(g, q[:, None])[:, 0, :, :, None].exp() * S  # decay the rows: [B, H, 1|Dk, 1]
    if beta is not None:  # delta rule: write only the part of v the (decayed) memory gets wrong
        v = beta.to(q.dtype)[:, 0, :, None] * (v - _read(S, k))
    S = S + _outer(k, v)  # [B, H, Dk, Dv]
    return _read(S, scale * q)[:, None].to(out_dtype), S  # o [B, 1, H, Dv]


@triton_twin
def recurrent_step_decay_additive(q, k, v, g=None, initial_state=None, scale=None):
    """Decoding step: S = exp(g) * S + k v^T, o = S^T (scale q). q, k, v [B, 1, H, D]; g [H],
    [B, 1, H], [B, 1, H, Dk] or None. Twin: one fused kernel (no backward)."""
    return _step(q, k, v, None, g, initial_state, scale)


@triton_twin
def recurrent_step_delta_rule(q, k, v, beta, g=None, initial_state=None, scale=None):
    """Decoding step: S = exp(g) * S; S = S + beta k (v - S^T k)^T; o = S^T (scale q).
    beta [B, 1, H]. Twin: one fused kernel (no backward)."""
    return _step(q, k, v, beta, g, initial_state, scale)


def recurrent_decay_additive(q, k, v, g=None, initial_state=None, scale=None, chunk_size=None):
    """The token-by-token loop of the decayed additive family (chunk_size unused: the chunked
    form's signature)."""
    S, out = initial_state, []
    for t in range(q.shape[1]):
        o, S = _step(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], None, _at(g, t), S, scale)
        out.append(o)
    return torch.cat(out, 1), S


def recurrent_delta_rule(q, k, v, beta, g=None, initial_state=None, scale=None, chunk_size=None):
    """The token-by-token loop of the delta-rule family (chunk_size unused: the chunked form's
    signature)."""
    S, out = initial_state, []
    for t in range(q.shape[1]):
        sl = slice(t, t + 1)
        o, S = _step(q[:, sl], k[:, sl], v[:, sl], beta[:, sl], _at(g, t), S, scale)
        out.append(o)
    return torch.cat(out, 1), S


# ---------------------------------------------------------------------------------------------
# 4. The chunked form: parallel inside chunks of C tokens, recurrent across chunks.
# Inside a chunk G_i = g_1 + ... + g_i is the cumulative log decay from the chunk start, so
# G is non-increasing. Every exponent formed below is <= 0 (no overflow, whatever the gates):
#   O = (Q exp(G)) h + P V,   P_ij = sum_d q_id k_jd exp(G_id - G_jd) for j <= i
#   h' = exp(G_C) h + (K exp(G_C - G))^T V


def _decayed_scores(x, y, G, strict):
    """P_ij = sum_d x_id y_jd exp(G_id - G_jd) for j <= i (j < i if strict), 0 above.
    x, y [..., C, D]; G [..., C, 1] (one decay per head) or [..., C, D] (one per channel).
    -> [..., C, C]"""
    C = x.shape[-2]
    idx = torch.arange(C, device=x.device)
    causal = idx[:, None] > idx if strict else idx[:, None] >= idx  # [C, C]
    if G.shape[-1] == 1:
        # one decay per head factors out of the dot product; masking before exp means that the
        # positive exponents above the diagonal are never formed
        D = torch.where(causal, G - G.transpose(-1, -2), -math.inf).exp()  # [..., C, C]
        return (x @ y.transpose(-1, -2)) * D
    # Per channel the factor sits inside the dot product. Cut the chunk into n sub-chunks of s.
    s = SUB if C % SUB == 0 else C
    n = C // s
    xs, ys, Gs = (t.unflatten(-2, (n, s)) for t in (x, y, G))  # [..., n, s, D]
    # diagonal blocks: the exact factor per (i, j, channel), masked before exp
    diff = Gs[..., :, None, :] - Gs[..., None, :, :]  # [..., n, s, s, D]
    D = torch.where(causal[:s, :s, None], diff, -math.inf).exp()
    diag = torch.einsum("...id,...jd,...ijd->...ij", xs, ys, D)  # [..., n, s, s]
    # blocks below the diagonal (sub-chunk a > b): split the factor at r, the first position of
    # sub-chunk a: exp(G_i - G_r) <= 1 goes to x, exp(G_r - G_j) <= 1 to y (fla's chunk_gla idea)
    Gr = Gs[..., :1, :]  # [..., n, 1, D]
    xr = xs * (Gs - Gr).exp()  # [..., n, s, D]
    below = (idx[:n, None] > idx[:n])[:, :, None, None]  # [n, n, 1, 1]: a > b
    to_r = torch.where(below, Gr.unsqueeze(-3) - Gs.unsqueeze(-4), -math.inf)  # [..., n, n, s, D]
    yr = ys.unsqueeze(-4) * to_r.exp()
    off = torch.einsum("...aid,...abjd->...aibj", xr, yr)  # [..., n, s, n, s]
    eye = torch.eye(n, dtype=x.dtype, device=x.device)
    full = off + torch.einsum("...aij,ab->...aibj", diag, eye)  # diagonal blocks in place
    return full.reshape(*x.shape[:-2], C, C)


@_fp32
def _chunked(q, k, v, beta, g, initial_state, scale, chunk_size):
    """Both families chunk by chunk (beta=None: decayed additive). See section 4's header."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    B, T, H, Dk = q.shape
    Dv, C = v.shape[-1], chunk_size
    N = -(-T // C)  # number of chunks; the last one is zero-padded
    g = _log_decay(g, q)  # [B, T, H, 1 or Dk]

    def chunks(x):  # [B, T, H, X] -> [B, H, N, C, X]; padding (k = v = g = beta = 0) keeps S
        x = F.pad(x, (0, 0, 0, 0, 0, N * C - T))
        return x.view(B, N, C, H, -1).permute(0, 3, 1, 2, 4)

    q, k, v, g = chunks(scale * q), chunks(k), chunks(v), chunks(g)
    G = g.cumsum(3)  # [B, H, N, C, Dg] log decay from the chunk start to i, inclusive
    G_last = G[:, :, :, -1:]  # [B, H, N, 1, Dg] decay over the whole chunk
    q_in = q * G.exp()  # queries reading the chunk's start state
    k_out = k * (G_last - G).exp()  # keys as the chunk's end state sees them
    P = _decayed_scores(q, k, G, strict=False)  # [B, H, N, C, C]
    if beta is not None:
        # <-- vs decayed additive: the written values depend on the state. Token i writes
        # u_i = beta_i (v_i - S'_i^T k_i), S'_i the decayed state just before it; inside a chunk
        # that is the unit lower-triangular system (I + A) U = beta V - beta exp(G) K h with
        # A_ij = beta_i sum_d k_id k_jd exp(G_id - G_jd), j < i (the WY/UT form). Solving it once
        # per chunk gives U = U0 - W h, linear in the state h it starts from.
        beta = chunks(beta.to(q.dtype)[..., None])  # [B, H, N, C, 1]
        A = _decayed_scores(beta * k, k, G, strict=True)  # [B, H, N, C, C]
        eye = torch.eye(C, dtype=A.dtype, device=A.device)
        rhs = torch.cat([beta * v, beta * k * G.exp()], -1)  # [B, H, N, C, Dv + Dk]
        UW = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        U0, W = UW.split([Dv, Dk], -1)
    out = []
    for c in range(N):  # the sequential part: hand the state from chunk to chunk
        # the values written [B, H, C, Dv]
        u = v[:, :, c] if beta is None else U0[:, :, c] - W[:, :, c] @ S
        out.append(q_in[:, :, c] @ S + P[:, :, c] @ u)  # [B, H, C, Dv]
        S = G_last[:, :, c].exp().transpose(-1, -2) * S + k_out[:, :, c].transpose(-1, -2) @ u
    o = torch.stack(out, 2).permute(0, 2, 3, 1, 4).reshape(B, N * C, H, Dv)[:, :T]  # [B, T, H, Dv]
    return o.to(out_dtype), S


@triton_twin
def chunk_decay_additive(q, k, v, g=None, initial_state=None, scale=None, chunk_size=64,
                         gate_min=None):
    """S_t = exp(g_t) * S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t), chunked. -> (o, final_state)
    gate_min: accepted and ignored, as triton_ops.chunk_decay_additive's bound on g (this form is
    exact for any gate), so that callers pass it to either backend. Twin: Triton kernels with
    hand-written backward kernels."""
    return _chunked(q, k, v, None, g, initial_state, scale, chunk_size)


@triton_twin
def chunk_delta_rule(q, k, v, beta, g=None, initial_state=None, scale=None, chunk_size=64,
                     gate_min=None):
    """S_t = exp(g_t) S_{t-1}; S_t += beta_t k_t (v_t - S_t^T k_t)^T; o_t = S_t^T (scale q_t),
    chunked. gate_min as in chunk_decay_additive. Twin: Triton kernels, as its."""
    return _chunked(q, k, v, beta, g, initial_state, scale, chunk_size)


# ---------------------------------------------------------------------------------------------
# 5. What every mixer layer shares: the glue around the recurrence, and MixerLayer.
# Each glue function has a Triton twin, which fuses what PyTorch runs as chains of small
# memory-bound passes (triton_ops.py, section 5).


@triton_twin
def in_projection(x, weight, widths):
    """x [B, T, C] times a layer's stacked projections, weight [N, C], cut into parts [B, T, w] of
    widths. Twin: the same values from products with aligned rows, q, k, v one of their own."""
    return F.linear(x, weight).split(list(widths), -1)


@triton_twin
def short_conv(x, weight, parts=1, l2_parts=0, head_dim=None, tail=None):
    """The short conv: silu(causal depthwise conv over time) of x [B, T, D] with taps weight
    [D, S] (tap S-1 multiplies the current token), continuing from tail [B, S-1, D], the inputs
    just before x (None: a zero past). y [B, T, D] in x's dtype, cut along the channels into
    `parts` tensors [B, T, D / parts] (q, k, v of one projection; parts=1: y itself), the first
    l2_parts of them L2-normalized per head of head_dim channels. Twin: one fused kernel for
    conv, cut and norms, from a zero past only (a decoding step's tail stays in PyTorch)."""
    if tail is None:
        tail = x.new_zeros(x.shape[0], weight.shape[1] - 1, x.shape[2])
    T, x = x.shape[1], torch.cat([tail.to(x.dtype), x], 1)  # [B, S-1+T, D]
    if T == 1:  # a decoding step: its S inputs times the taps, without a conv's overhead
        acc = torch.promote_types(x.dtype, torch.float32)  # bf16 summed in fp32, as a conv does
        y = F.silu((x.to(acc) * weight.t().to(acc)).sum(1, keepdim=True)).to(x.dtype)
    else:
        y = F.conv1d(x.transpose(1, 2), weight[:, None, :].to(x.dtype), groups=x.shape[2])
        y = F.silu(y.transpose(1, 2))  # [B, T, D]
    ys = list(y.chunk(parts, -1))
    for i in range(l2_parts):  # unit q and k per head
        ys[i] = l2_normalize(ys[i].unflatten(-1, (-1, head_dim))).flatten(-2)
    return ys[0] if parts == 1 else ys


class ShortConv(nn.Module):
    """The short conv's taps [dim, size] (short_conv), and its decoding: a step reads the last
    size-1 inputs, the tail, in place of the whole past."""

    def __init__(self, dim, size):
        super().__init__()
        # init: identity (current-token tap 1, others 0), so a new student sees the teacher's
        # q, k, v through SiLU only. <-- vs fla: its default random Conv1d init scrambles them
        w = torch.zeros(dim, size)
        w[:, -1] = 1.0
        self.weight = nn.Parameter(w)  # [dim, size]

    def forward(self, x, tail=None):
        """x [B, T, dim] after tail [B, size-1, dim] (None: a zero past) -> y [B, T, dim] and the
        new tail, in PyTorch."""
        return short_conv(x, self.weight, tail=tail), self.next_tail(x, tail)

    def next_tail(self, x, tail=None):
        """The last size-1 inputs once x is read after tail (None: a zero past), [B, size-1, dim]:
        what decoding keeps of the past. A new tensor."""
        n = self.weight.shape[1] - 1
        if tail is None:
            tail = x.new_zeros(x.shape[0], n, x.shape[2])
        x = x[:, max(0, x.shape[1] - n) :]  # at most the last n inputs
        return torch.cat([tail.to(x.dtype), x], 1)[:, x.shape[1] :]


@triton_twin
def l2_normalize(x, eps=1e-24):
    """x / |x| over the last axis (F.normalize's floor of sqrt(eps) on |x|). Twin: one kernel."""
    return F.normalize(x, dim=-1, eps=math.sqrt(eps))


ACTS = {"silu": F.silu, "sigmoid": torch.sigmoid}  # the output gates


@triton_twin
def rms_norm_gate(x, weight, z=None, act=None, eps=1e-5):
    """RMSNorm over the last axis (fp32 inside), times weight, times act(z) when a gate z is
    given. Twin: one kernel."""
    xf = x.float()
    y = weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y if z is None else y * ACTS[act](z)


class MixerLayer(nn.Module):
    """What the seven mixers share. forward reads as the papers do: project x, short conv and
    heads, maps of q and k, gates, the recurrence, norm and gate, project out. A subclass
    declares its name, family and decay granularity and the extra projections of x it needs
    (projections), maps q and k (qk_maps: feature maps, positions) and makes the gates of its
    recurrence (gates: beta, the log decay g, ...)."""

    # registry key; "additive" or "delta"; the decay: None, "head_const", "head" or "channel"
    name = family = decay = None
    textbook = None  # the mixer's token-by-token recurrence of section 2 (backend "naive")
    out_norm = None  # per-head output norm: "rms" or "layer"
    out_gate = None  # per-channel output gate from x: "silu" or "sigmoid"
    qk_l2 = False  # L2-normalize q and k per head (after the short conv)
    gate_min = None  # a floor every log decay the mixer makes keeps (GLA, KDA: GATE_MIN), or None
    backend = None  # "naive", "torch" or "triton"; None: triton for CUDA tensors, torch otherwise

    def __init__(self, config, layer_idx):
        super().__init__()
        C, H, D = config.n_embd, config.n_head, config.head_dim
        self.layer_idx, self.n_head, self.n_kv_head = layer_idx, H, config.n_kv_head
        self.head_dim, self.eps = D, config.rms_eps
        # every mixer has the teacher's n_head heads of width head_dim: the same state size for all.
        # <-- vs the study's code: head counts differed per mixer (states up to 8x apart)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        # every projection of x in one matmul, as nanoGPT's c_attn: q, k, v (one key head per
        # query head), then the mixer's own, split by these widths
        self.widths = self.projections(H, D)
        self.in_proj = nn.Linear(C, sum(self.widths.values()), bias=False)
        # one switch for every mixer. <-- vs the study's code: only the delta rules had the conv
        self.conv = ShortConv(3 * H * D, config.conv_size) if config.short_conv else None
        if self.out_norm:  # the norm's weight per channel of a head, shared by the heads; init 1
            self.o_norm = nn.Parameter(torch.ones(D))

    def projections(self, H, D):
        """name -> width of each projection of x that in_proj holds, in order."""
        return {"qkv": 3 * H * D, **({"gate": H * D} if self.out_gate else {})}

    def forward(self, x, rope, cache=None):
        """x [B, T, C] -> [B, T, C]. cache: None (training) or this layer's dict: a prefill
        (T > 1) runs the chunked form, T = 1 the step; it holds the state and the conv tail,
        nothing more."""
        B, T, _ = x.shape
        backend = resolve_backend(self.backend, x)  # the one choice; every call below gets it
        parts = in_projection(x, self.in_proj.weight, self.widths.values(), backend=backend)
        p = dict(zip(self.widths, parts))  # [B, T, width] each
        q, k, v = self.heads(p["qkv"], cache, backend)  # [B, T, H, D] each
        q, k = self.qk_maps(q, k, rope)
        gates = self.gates(p, backend)  # the recurrence's arguments besides q, k, v
        state = None if cache is None else cache.get("state")
        step = cache is not None and T == 1  # decoding
        o, state = self.recurrence(q, k, v, gates, state, backend, step)  # [B, T, H, D]
        if cache is not None:
            cache["state"] = state
        o = self.norm_gate(o, p.get("gate"), backend)
        return self.o_proj(o.reshape(B, T, -1))

    def heads(self, qkv, cache, backend):
        """q, k, v [B, T, H, D] from qkv [B, T, 3 H D]: the short conv, the cut into heads, and
        unit q and k per head when qk_l2. A cache keeps the conv's tail for decoding."""
        B, T, _ = qkv.shape
        H, D = self.n_head, self.head_dim
        tail = None if cache is None else cache.get("conv")
        if self.conv is not None and tail is None:  # from a zero past (training, a prompt)
            # conv, cut into q, k, v and their L2 norms in one op (one kernel on triton)
            q, k, v = short_conv(qkv, self.conv.weight, parts=3, l2_parts=2 * self.qk_l2,
                                 head_dim=D, backend=backend)
            q, k, v = q.view(B, T, H, D), k.view(B, T, H, D), v.view(B, T, H, D)
            if cache is not None:  # a prompt: decoding goes on from its last inputs
                tail = self.conv.next_tail(qkv)
        else:
            if self.conv is not None:  # decoding: the conv continues from the kept tail
                qkv, tail = self.conv(qkv, tail)
            q, k, v = qkv.view(B, T, 3, H, D).unbind(2)
            if self.qk_l2:  # unit keys keep every delta-rule write a contraction (beta |k|^2 <= 1)
                q, k = l2_normalize(q, backend=backend), l2_normalize(k, backend=backend)
        if cache is not None and self.conv is not None:
            cache["conv"] = tail
        return q, k, v

    def qk_maps(self, q, k, rope):
        """The mixer's maps of q and k [B, T, H, D] before the recurrence: feature maps, RoPE.
        None here."""
        return q, k

    def gates(self, p, backend):
        """The keyword arguments of the mixer's recurrence besides q, k, v (beta, the log decay g,
        ...) from the projections p of x. None here."""
        return {}

    def recurrence(self, q, k, v, gates, state, backend, step):
        """The mixer's recurrence from state (None: zeros) -> (o [B, T, H, Dv], new state). naive:
        its textbook loop; else its family's one-token step when decoding, its chunked form
        otherwise."""
        if backend == "naive":
            return self.textbook(q, k, v, **gates, initial_state=state)
        g, gate_min = gates.get("g"), self.gate_min
        if self.family == "additive":
            if step:
                return recurrent_step_decay_additive(q, k, v, g, state, backend=backend)
            return chunk_decay_additive(q, k, v, g, state, gate_min=gate_min, backend=backend)
        beta = gates["beta"]
        if step:
            return recurrent_step_delta_rule(q, k, v, beta, g, state, backend=backend)
        return chunk_delta_rule(q, k, v, beta, g, state, gate_min=gate_min, backend=backend)

    def norm_gate(self, o, z, backend):
        """The per-head output norm, times the output gate act(z) from x. o [B, T, H, D]."""
        z = None if z is None else z.view_as(o)
        if self.out_norm == "rms":
            return rms_norm_gate(o, self.o_norm, z, self.out_gate, self.eps, backend=backend)
        if self.out_norm == "layer":  # xLSTM's multi-head LayerNorm, no bias
            o = F.layer_norm(o, o.shape[-1:], self.o_norm, None, self.eps)
        return o if z is None else o * ACTS[self.out_gate](z)

    @torch.no_grad()
    def init_from_attention(self, attn):
        """Copy q_proj and o_proj from a teacher attention into their slices; expand its grouped
        k_proj and v_proj so that student head h reads teacher KV head h // n_rep (n_rep =
        n_head // n_kv_head). <-- vs the study's code: it repeated 32-row blocks, misaligning
        64-wide heads."""
        n_rep, HD = self.n_head // self.n_kv_head, self.n_head * self.head_dim
        q, k, v = self.in_proj.weight[: 3 * HD].view(3, HD, -1)  # [H D, C] each, views of in_proj
        for name, dst in (("q_proj", q), ("k_proj", k), ("v_proj", v),
                          ("o_proj", self.o_proj.weight)):
            src = getattr(attn, name).weight
            if name in ("k_proj", "v_proj"):  # [H_kv D, C] -> [H_kv, D, C] -> [H D, C]
                src = src.view(self.n_kv_head, self.head_dim, -1).repeat_interleave(n_rep, 0)
                src = src.flatten(0, 1)
            if src.shape != dst.shape:
                raise ValueError(f"{name}: teacher shape {tuple(src.shape)} != student shape "
                                 f"{tuple(dst.shape)}")
            dst.copy_(src)


# ---------------------------------------------------------------------------------------------
# 6. The seven mixer layers, each beside the functions that make its gates; the registry.
# Initialization: model.SmolLM2 re-initializes every nn.Linear weight with N(0, 0.02) after the
# layers are built, and checkpoint.student_from_teacher then copies q/k/v/o from the teacher. So
# a Linear weight below starts at N(0, 0.02) in a model; biases and plain Parameters keep the
# inits here.


class FeatureMap(nn.Module):
    """phi(x) = (W1 x + b1) * (W2 x + b2) over each head's channels, shared by the heads."""

    def __init__(self, dim):
        super().__init__()
        # init: W1 = I, b1 = 0, W2 = 0, b2 = 1, so phi starts as the identity and a new student's
        # scores are the teacher's q.k without the softmax (plain Parameters keep this init)
        self.w1, self.b1 = nn.Parameter(torch.eye(dim)), nn.Parameter(torch.zeros(dim))
        self.w2, self.b2 = nn.Parameter(torch.zeros(dim, dim)), nn.Parameter(torch.ones(dim))

    def forward(self, x):  # [..., dim] -> [..., dim]
        return F.linear(x, self.w1, self.b1) * F.linear(x, self.w2, self.b2)


class LinearAttention(MixerLayer):
    """Linear attention with a learnable feature map; no decay, no normalizer, no output norm."""

    name, family, decay = "linear_attention", "additive", None
    textbook = staticmethod(linear_attention_recurrent)

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.q_map, self.k_map = FeatureMap(self.head_dim), FeatureMap(self.head_dim)

    def qk_maps(self, q, k, rope):
        return self.q_map(q), self.k_map(k)


def retnet_log_decay(n_head, dtype=torch.float32, device=None):
    """RetNet's fixed decays gamma_h = 1 - 2^(-5-h) as log decays g [H], through log1p: exact
    near gamma = 1."""
    return torch.log1p(-(2.0 ** (-5.0 - torch.arange(n_head, dtype=dtype, device=device))))


class RetNet(MixerLayer):
    """Retention: fixed decay gamma_h per head, RoPE on q and k; RMSNorm times swish gate."""

    name, family, decay = "retnet", "additive", "head_const"
    textbook = staticmethod(retnet_recurrent)
    out_norm, out_gate = "rms", "silu"

    def qk_maps(self, q, k, rope):
        return rope(q), rope(k)  # the only student with positions

    def gates(self, p, backend):
        x = p["qkv"]  # the decays in q's compute dtype (fp32, or float64 for float64 inputs)
        return {"g": retnet_log_decay(self.n_head, torch.promote_types(x.dtype, torch.float32),
                                      x.device)}  # [H]


class GLA(MixerLayer):
    """Gated linear attention: data-dependent decay per key channel; RMSNorm times swish gate."""

    name, family, decay = "gla", "additive", "channel"
    textbook = staticmethod(gla_recurrent)
    out_norm, out_gate = "rms", "silu"
    gate_min = GATE_MIN

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        # rank-16 gate: in_proj's "decay" rows down to 16, gk_up back to H * D. Bias init 0, so
        # with small weights a new student decays by about sigmoid(0)^(1/16) = 0.958 per token:
        # a memory of ~24 tokens
        self.gk_up = nn.Linear(16, self.n_head * self.head_dim)
        nn.init.zeros_(self.gk_up.bias)

    def projections(self, H, D):
        return super().projections(H, D) | {"decay": 16}

    def gates(self, p, backend):
        a = self.gk_up(p["decay"]).unflatten(-1, (self.n_head, self.head_dim))  # [B, T, H, Dk]
        g = F.logsigmoid(a) / 16  # /16 keeps a near 1
        # floored at GATE_MIN, which logsigmoid / 16 reaches only for a pre-activation below -80.
        # <-- vs GLA's paper: unbounded below; the floor lets the kernels use tensor cores
        return {"g": g.clamp(min=GATE_MIN)}


def softcap(x, cap=MLSTM_CAP):  # cap * tanh(x / cap): smooth, identity near 0, bounded by cap
    return cap * torch.tanh(x / cap)


def mlstm_family(q, k, v, i_pre, f_pre, initial_state=None, scale=None, step=False,
                 backend="torch"):
    """mLSTM as a decayed additive recurrence on the backend, equal to mlstm_recurrent: the
    chunked form, or the step when step. Decay g = log f (per head). The input gate goes into
    the key, k' = exp(i~ - MLSTM_CAP) k, and v' = [v, 1] makes the last state column the
    normalizer n. Stabilizer: instead of the running max m_t, a fixed m = MLSTM_CAP. The layer
    soft-caps i~ below MLSTM_CAP, so exp(i~ - m) lies in (e^-30, 1): no overflow in fp32 or bf16,
    no underflow to zero, and a fixed m composes with chunks, kernels and decoding for free.
    Scaling C and n by e^-m turns max(|n^T q|, 1) into max(|n'^T q|, e^-m).
    State [B, H, Dk, Dv + 1] = [C, n] e^-m."""
    k = k * torch.exp(i_pre - MLSTM_CAP)[..., None]  # [B, T, H, Dk], input gate folded in
    v = torch.cat([v, torch.ones_like(v[..., :1])], -1)  # [B, T, H, Dv + 1]
    g = F.logsigmoid(f_pre)  # [B, T, H] log forget gate
    if step:
        o, S = recurrent_step_decay_additive(q, k, v, g, initial_state, scale, backend=backend)
    else:
        o, S = chunk_decay_additive(q, k, v, g, initial_state, scale, backend=backend)
    out_dtype = o.dtype
    o = o.to(torch.promote_types(o.dtype, torch.float32))  # [B, T, H, Dv + 1]: C^T q, n^T q
    h = o[..., :-1] / o[..., -1:].abs().clamp(min=math.exp(-MLSTM_CAP))
    return h.to(out_dtype), S


def mlstm_convert_state(state):
    """An mLSTM state from one layout to the other, the same memory either way:
    mlstm_recurrent's (C, n, m), xLSTM's C and n stabilized at their running max m, to
    mlstm_family's S = [C, n] e^-MLSTM_CAP [B, H, Dk, Dv + 1], stabilized at the fixed cap,
    and back (where m = MLSTM_CAP)."""
    if isinstance(state, tuple):  # C exp(-m) = C exp(-MLSTM_CAP) exp(MLSTM_CAP - m)
        C, n, m = state
        return torch.cat([C, n[..., None]], -1) * torch.exp(m - MLSTM_CAP)[..., None, None]
    return state[..., :-1], state[..., -1], torch.full_like(state[..., 0, 0], MLSTM_CAP)


class MLSTM(MixerLayer):
    """xLSTM's mLSTM: exponential input gate, sigmoid forget gate, normalizer; per-head LayerNorm
    times sigmoid output gate."""

    # decay: the forget gate; the input gate goes into k
    name, family, decay = "mlstm", "additive", "head"
    textbook = staticmethod(mlstm_recurrent)
    out_norm, out_gate = "layer", "sigmoid"

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        H = self.n_head
        # gate pre-activations i~, f~ per head: in_proj's "input" and "forget" rows plus these
        # biases. Inits: input 0 (i = 1: every token enters at weight one and the normalizer
        # averages, close to what attention does); forget linspace(3, 6) over heads, as in
        # xLSTM-7B (f = 0.95 .. 0.998, memories of ~20 to ~400 tokens)
        self.i_bias = nn.Parameter(torch.zeros(H))
        self.f_bias = nn.Parameter(torch.linspace(3.0, 6.0, H))

    def projections(self, H, D):
        return super().projections(H, D) | {"input": H, "forget": H}

    def gates(self, p, backend):  # [B, T, H] each
        return {"i_pre": softcap(p["input"] + self.i_bias),
                "f_pre": softcap(p["forget"] + self.f_bias)}

    def recurrence(self, q, k, v, gates, state, backend, step):
        if backend != "naive":
            return mlstm_family(q, k, v, **gates, initial_state=state, step=step, backend=backend)
        # the textbook keeps xLSTM's own state; a cache holds the family's on every backend
        state = None if state is None else mlstm_convert_state(state)
        h, state = self.textbook(q, k, v, **gates, initial_state=state)
        return h, mlstm_convert_state(state)


class DeltaNet(MixerLayer):
    """DeltaNet: the delta rule with L2-normalized q, k and a learned step beta; per-head
    RMSNorm."""

    name, family, decay = "deltanet", "delta", None
    textbook = staticmethod(deltanet_recurrent)
    out_norm, qk_l2 = "rms", True

    def projections(self, H, D):
        return super().projections(H, D) | {"beta": H}  # beta = sigmoid(.) ~ 0.5 at init

    def gates(self, p, backend):
        return {"beta": torch.sigmoid(p["beta"])}  # [B, T, H]


@triton_twin
def softplus_decay(a, A_log, dt_bias):
    """Mamba-2's log decay -exp(A_log) * softplus(a + dt_bias) <= 0, fp32: a [B, T, H] with A_log
    and dt_bias [H] (Gated DeltaNet), or a [B, T, H, K] with A_log [H] and dt_bias [H * K] (one
    per channel; KDA's is sigmoid_decay). Twin: one kernel."""
    A = A_log.exp().view(-1, *[1] * (a.dim() - 3))  # per head, over a's channels
    return -A * F.softplus(a + dt_bias.view(a.shape[2:]))


def _dt(n):
    """Mamba-2's step init: dt log-uniform in [1e-3, 1e-1]."""
    return torch.exp(torch.empty(n).uniform_(math.log(1e-3), math.log(1e-1)))


def _dt_bias(n):
    """Mamba-2's step init, stored as softplus^-1(dt)."""
    dt = _dt(n)
    return nn.Parameter(dt + torch.log(-torch.expm1(-dt)))


def _A_log(n):
    """Mamba-2's decay-rate init: A ~ U(0, 16), stored as log A."""
    return nn.Parameter(torch.empty(n).uniform_(0, 16).log())


class GatedDeltaNet(DeltaNet):
    """Gated DeltaNet: DeltaNet with a data-dependent decay per head; RMSNorm times swish gate."""

    name, family, decay = "gated_deltanet", "delta", "head"
    textbook = staticmethod(gated_deltanet_recurrent)
    out_gate = "silu"

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.A_log, self.dt_bias = _A_log(self.n_head), _dt_bias(self.n_head)  # Mamba-2 inits

    def projections(self, H, D):
        return super().projections(H, D) | {"decay": H}

    def gates(self, p, backend):  # [B, T, H] each
        g = softplus_decay(p["decay"], self.A_log, self.dt_bias, backend=backend)  # <= 0
        return {"beta": torch.sigmoid(p["beta"]), "g": g}


@triton_twin
def sigmoid_decay(a, A_log, dt_bias, floor):
    """Kimi Linear's bounded log decay floor * sigmoid(exp(A_log) * (a + dt_bias)), in (floor, 0),
    fp32; a, A_log, dt_bias as softplus_decay takes them. Twin: one kernel."""
    A = A_log.exp().view(-1, *[1] * (a.dim() - 3))
    return floor * torch.sigmoid(A * (a + dt_bias.view(a.shape[2:])))


def _dt_bias_bounded(A_log, width):
    """dt_bias [H * width] for sigmoid_decay with floor GATE_MIN such that, for a = 0, the log
    decay is Mamba-2's -A dt at its init (dt log-uniform in [1e-3, 1e-1]): GATE_MIN sigmoid(A b)
    = -A dt for b = logit(A dt / -GATE_MIN) / A, A dt <= 1.6 < 5."""
    A = A_log.detach().exp().repeat_interleave(width)
    return nn.Parameter(torch.logit(A * _dt(A.numel()) / -GATE_MIN) / A)


class KDA(DeltaNet):
    """Kimi Delta Attention: the delta rule after a data-dependent decay per key channel;
    RMSNorm times sigmoid gate. <-- vs the study's code: the gate multiplies the normed output
    (its code added it into the RMSNorm instead)."""

    name, family, decay = "kda", "delta", "channel"
    textbook = staticmethod(kda_recurrent)
    out_gate = "sigmoid"
    gate_min = GATE_MIN

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        H, D = self.n_head, self.head_dim
        # low-rank decay (rank head_dim, as in Kimi Linear): in_proj's "decay" rows, then f_up;
        # A per head, dt per channel. The log decay is Kimi Linear's bounded one, GATE_MIN
        # sigmoid(A (a + dt_bias)), with dt_bias set so that for a = 0 the decay is Mamba-2's
        # exp(-A dt) at its init (A ~ U(0, 16), dt log-uniform in [1e-3, 1e-1]: a per-token decay
        # of about 0.94 at the median channel, 0.2 = exp(-1.6) at the fastest possible)
        self.f_up = nn.Linear(D, H * D, bias=False)
        self.A_log = _A_log(H)
        self.dt_bias = _dt_bias_bounded(self.A_log, D)

    def projections(self, H, D):
        return super().projections(H, D) | {"decay": D}

    def gates(self, p, backend):
        a = self.f_up(p["decay"]).unflatten(-1, (self.n_head, self.head_dim))  # [B, T, H, Dk]
        # <-- vs the study's code: Mamba-2's -A softplus(a + dt_bias), unbounded below
        g = sigmoid_decay(a, self.A_log, self.dt_bias, GATE_MIN, backend=backend)
        return {"beta": torch.sigmoid(p["beta"]), "g": g}  # [B, T, H], [B, T, H, Dk]


LAYERS = {c.name: c for c in (LinearAttention, RetNet, GLA, MLSTM, DeltaNet, GatedDeltaNet, KDA)}
MIXERS = tuple(LAYERS)  # the seven students, in the study's order
FAMILY = {name: (c.family, c.decay) for name, c in LAYERS.items()}
