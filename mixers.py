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

Inside, in reading order:
  1. seven textbook recurrences, token by token in fp32, one per mixer (the ground truth);
  2. the two family recurrences: one-token steps (decoding) and their loops;
  3. the chunked form of both families (the algorithm kernels.py implements in Triton);
  4. the mixer layers model.py builds for a student, the registry, and student_from_teacher.

One layout everywhere: q, k [B, T, H, Dk], v [B, T, H, Dv], state [B, H, Dk, Dv] in fp32, and
every function returns (output, final_state). A log decay g <= 0 comes as None (no decay), [H]
(constant per head), [B, T, H] (per head and token) or [B, T, H, Dk] (per key channel).
Two switches: USE_KERNELS (off with env LINEARIZE_KERNELS=0) sends CUDA tensors to kernels.py
(the recurrences, the short conv with the cut into heads and the L2 norm of q and k, the output
norm and gate, the log decay of Gated DeltaNet and KDA, and distill.py's stage-3 loss);
NAIVE makes the layers run the textbook recurrences of section 1 instead of the chunked form.

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

import dataclasses
import functools
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

MIXERS = ("linear_attention", "retnet", "gla", "mlstm", "deltanet", "gated_deltanet", "kda")
# each mixer's family and the granularity of its log decay g: None, "head_const" [H], "head"
# [B, T, H] or "channel" [B, T, H, Dk] (mLSTM: its forget gate; the input gate goes into k)
FAMILY = {
    "linear_attention": ("additive", None),
    "retnet": ("additive", "head_const"),
    "gla": ("additive", "channel"),
    "mlstm": ("additive", "head"),
    "deltanet": ("delta", None),
    "gated_deltanet": ("delta", "head"),
    "kda": ("delta", "channel"),
}
USE_KERNELS = os.environ.get("LINEARIZE_KERNELS", "1") != "0"  # CUDA tensors go to kernels.py
NAIVE = False  # True: the layers run section 1's token-by-token recurrences (slow; to read and test)
MLSTM_CAP = 15.0  # mLSTM gate pre-activations are soft-capped to (-15, 15); also its fixed stabilizer
SUB = 16  # sub-chunk width for per-channel decays inside a chunk


def _model():
    # model.py imports this file to build its mixers, so import it lazily to avoid the cycle
    import model

    return model


def _kernel(name, x):
    """kernels.<name> when x is on CUDA, USE_KERNELS is on and kernels.py defines it; else None.

    The kernel gets q, k and v in one dtype: autocast's while autocast is on, else x's. Under CUDA
    autocast, F.normalize and exp return fp32, and fp32 operands would send the kernels to exact
    fp32 products, many times slower than bf16 ones. Gates, beta and states pass as they are."""
    kern = _kernels(x)
    fn = None if kern is None else getattr(kern, name, None)
    return None if fn is None else _one_dtype(fn, x)


def _kernels(x):
    """The kernels module when work on x goes there (x on CUDA and USE_KERNELS on), else None.
    Imported here, on first use, so that CPU runs never need triton."""
    if not (USE_KERNELS and x.is_cuda):
        return None
    import kernels

    return kernels


def _one_dtype(fn, x):
    """fn(q, k, v, *rest) with q, k, v cast to autocast's dtype where autocast is on, else x's."""
    dev = x.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    return lambda q, k, v, *rest: fn(q.to(dtype), k.to(dtype), v.to(dtype), *rest)


def _fp32(fn):
    """Run fn with autocast off: under torch.autocast its matmuls would drop to bf16."""

    @functools.wraps(fn)
    def run(q, *args, **kwargs):
        with torch.autocast(q.device.type, enabled=False):
            return fn(q, *args, **kwargs)

    return run


def _prepare(q, k, v, initial_state, scale, extra_v=0):
    """fp32 copies (float64 stays float64, for exact tests), the default scale, the start state."""
    dt = torch.promote_types(q.dtype, torch.float32)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    B, _, H, Dk = q.shape
    if initial_state is None:
        S = q.new_zeros(B, H, Dk, v.shape[-1] + extra_v)
    else:
        S = initial_state.to(dt)
    return q, k, v, S, Dk**-0.5 if scale is None else scale


def _outer(a, b):  # a [B, H, Da], b [B, H, Db] -> a b^T [B, H, Da, Db]
    return a[..., :, None] * b[..., None, :]


def _read(S, q):  # S [B, H, Dk, Dv], q [B, H, Dk] -> S^T q [B, H, Dv]
    return (q[..., None, :] @ S)[..., 0, :]


# ---------------------------------------------------------------------------------------------
# 1. The seven textbook recurrences, as their papers write them, token by token in fp32.
# Gates arrive ready-made (the layers compute them); feature maps, norms and RoPE are applied
# by the layers too. These loops are what the chunked forms below are tested against.


@_fp32
def linear_attention_recurrent(q, k, v, initial_state=None, scale=None):
    """Linear attention: S_t = S_{t-1} + phi(k_t) v_t^T, o_t = S_t^T phi(q_t); q, k already mapped."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    out = []
    for t in range(q.shape[1]):
        S = S + _outer(k[:, t], v[:, t])
        out.append(_read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


@_fp32
def retnet_recurrent(q, k, v, initial_state=None, scale=None):
    """RetNet: S_t = gamma_h S_{t-1} + k_t v_t^T with gamma_h = 1 - 2^(-5-h); q, k carry RoPE."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    gamma = 1 - 2.0 ** (-5 - torch.arange(q.shape[2], dtype=q.dtype, device=q.device))  # [H]
    out = []
    for t in range(q.shape[1]):
        S = gamma[:, None, None] * S + _outer(k[:, t], v[:, t])
        out.append(_read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


@_fp32
def gla_recurrent(q, k, v, log_a, initial_state=None, scale=None):
    """GLA: S_t = Diag(a_t) S_{t-1} + k_t v_t^T, one decay a_t per key channel; log_a [B, T, H, Dk]."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    a = log_a.to(q.dtype).exp()
    out = []
    for t in range(q.shape[1]):
        S = a[:, t, :, :, None] * S + _outer(k[:, t], v[:, t])  # Diag(a) scales the rows of S
        out.append(_read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


@_fp32
def mlstm_recurrent(q, k, v, i_pre, f_pre, initial_state=None, scale=None):
    """mLSTM (xLSTM), with its running-max stabilizer:
        C_t = f_t C_{t-1} + i_t k_t v_t^T,  n_t = f_t n_{t-1} + i_t k_t,
        h_t = C_t^T q_t / max(|n_t^T q_t|, 1),  f_t = sigmoid(f~_t),  i_t = exp(i~_t).
    (C is stored transposed, [Dk, Dv], like every state here.) With m_t = max(log f_t + m_{t-1},
    i~_t) the loop keeps C~ = C exp(-m_t), n~ = n exp(-m_t), whose factors are all <= 1, and
    h_t = C~^T q / max(|n~^T q|, exp(-m_t)) is the same function without overflow.
    i_pre, f_pre [B, T, H] are i~, f~. The state has mlstm_family's layout, [C, n] exp(-MLSTM_CAP)
    as [B, H, Dk, Dv + 1], so the two forms hand states to each other."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale, extra_v=1)
    i_pre, f_pre = i_pre.to(q.dtype), f_pre.to(q.dtype)
    C, n = S[..., :-1], S[..., -1]  # [B, H, Dk, Dv], [B, H, Dk]: stabilized at m = MLSTM_CAP
    m = torch.full_like(i_pre[:, 0], MLSTM_CAP)  # [B, H]; any start works, this one matches S
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
    back = torch.exp(m - MLSTM_CAP)[..., None, None]  # rescale to the family's fixed stabilizer
    return torch.stack(out, 1).to(out_dtype), torch.cat([C, n[..., None]], -1) * back


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
def gated_deltanet_recurrent(q, k, v, beta, log_a, initial_state=None, scale=None):
    """Gated DeltaNet: S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T; log_a [B, T, H]."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    beta, a = beta.to(q.dtype), log_a.to(q.dtype).exp()
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    out = []
    for t in range(q.shape[1]):
        b = beta[:, t, :, None, None]  # [B, H, 1, 1]
        S = a[:, t, :, None, None] * ((eye - b * _outer(k[:, t], k[:, t])) @ S) + b * _outer(k[:, t], v[:, t])
        out.append(_read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


@_fp32
def kda_recurrent(q, k, v, beta, log_a, initial_state=None, scale=None):
    """KDA: S_t = (I - beta_t k_t k_t^T) Diag(a_t) S_{t-1} + beta_t k_t v_t^T; log_a [B, T, H, Dk]."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    beta, a = beta.to(q.dtype), log_a.to(q.dtype).exp()
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    out = []
    for t in range(q.shape[1]):
        b = beta[:, t, :, None, None]  # [B, H, 1, 1]
        S = (eye - b * _outer(k[:, t], k[:, t])) @ (a[:, t, :, :, None] * S) + b * _outer(k[:, t], v[:, t])
        out.append(_read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


# ---------------------------------------------------------------------------------------------
# 2. The two families, one token at a time: the decoding steps and their loops.


def _log_decay(g, q):
    """A log decay of any granularity as [B, T, H, 1] (one per head) or [B, T, H, Dk] (per channel)."""
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


def step_decay_additive(q, k, v, g=None, initial_state=None, scale=None):
    """Decoding step: S = exp(g) * S + k v^T, o = S^T (scale q). q, k, v [B, 1, H, D]; g [H],
    [B, 1, H], [B, 1, H, Dk] or None. Uses kernels.recurrent_step_decay_additive when present."""
    fn = _kernel("recurrent_step_decay_additive", q)
    if fn is not None:
        return fn(q, k, v, g, initial_state, scale)
    return _step(q, k, v, None, g, initial_state, scale)


def step_delta_rule(q, k, v, beta, g=None, initial_state=None, scale=None):
    """Decoding step: S = exp(g) * S; S = S + beta k (v - S^T k)^T; o = S^T (scale q). beta [B, 1, H]."""
    fn = _kernel("recurrent_step_delta_rule", q)
    if fn is not None:
        return fn(q, k, v, beta, g, initial_state, scale)
    return _step(q, k, v, beta, g, initial_state, scale)


def recurrent_decay_additive(q, k, v, g=None, initial_state=None, scale=None, chunk_size=None):
    """The token-by-token loop of the decayed additive family (chunk_size unused: same signature)."""
    S, out = initial_state, []
    for t in range(q.shape[1]):
        o, S = _step(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], None, _at(g, t), S, scale)
        out.append(o)
    return torch.cat(out, 1), S


def recurrent_delta_rule(q, k, v, beta, g=None, initial_state=None, scale=None, chunk_size=None):
    """The token-by-token loop of the delta-rule family (chunk_size unused: same signature)."""
    S, out = initial_state, []
    for t in range(q.shape[1]):
        sl = slice(t, t + 1)
        o, S = _step(q[:, sl], k[:, sl], v[:, sl], beta[:, sl], _at(g, t), S, scale)
        out.append(o)
    return torch.cat(out, 1), S


# ---------------------------------------------------------------------------------------------
# 3. The chunked form: parallel inside chunks of C tokens, recurrent across chunks.
# Inside a chunk G_i = g_1 + ... + g_i is the cumulative log decay from the chunk start, so
# G is non-increasing. Every exponent formed below is <= 0 (no overflow, whatever the gates):
#   O = (Q exp(G)) h + P V,   P_ij = sum_d q_id k_jd exp(G_id - G_jd) for j <= i
#   h' = exp(G_C) h + (K exp(G_C - G))^T V


def _decayed_scores(x, y, G, strict):
    """P_ij = sum_d x_id y_jd exp(G_id - G_jd) for j <= i (j < i if strict), 0 above. -> [..., C, C]
    x, y [..., C, D]; G [..., C, 1] (one decay per head) or [..., C, D] (one per channel)."""
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
    yr = ys.unsqueeze(-4) * torch.where(below, Gr.unsqueeze(-3) - Gs.unsqueeze(-4), -math.inf).exp()
    off = torch.einsum("...aid,...abjd->...aibj", xr, yr)  # [..., n, s, n, s]
    eye = torch.eye(n, dtype=x.dtype, device=x.device)
    full = off + torch.einsum("...aij,ab->...aibj", diag, eye)  # diagonal blocks in place
    return full.reshape(*x.shape[:-2], C, C)


@_fp32
def _chunked(q, k, v, beta, g, initial_state, scale, chunk_size):
    """Both families chunk by chunk (beta=None: decayed additive). See section 3's header."""
    out_dtype = v.dtype
    q, k, v, S, scale = _prepare(q, k, v, initial_state, scale)
    B, T, H, Dk = q.shape
    Dv, C = v.shape[-1], chunk_size
    N = -(-T // C)  # number of chunks; the last one is zero-padded
    g = _log_decay(g, q)  # [B, T, H, 1 or Dk]

    def chunks(x):  # [B, T, H, X] -> [B, H, N, C, X]; padding (k = v = g = beta = 0) leaves S alone
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
        U0, W = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True).split([Dv, Dk], -1)
    out = []
    for c in range(N):  # the sequential part: hand the state from chunk to chunk
        u = v[:, :, c] if beta is None else U0[:, :, c] - W[:, :, c] @ S  # values written [B, H, C, Dv]
        out.append(q_in[:, :, c] @ S + P[:, :, c] @ u)  # [B, H, C, Dv]
        S = G_last[:, :, c].exp().transpose(-1, -2) * S + k_out[:, :, c].transpose(-1, -2) @ u
    o = torch.stack(out, 2).permute(0, 2, 3, 1, 4).reshape(B, N * C, H, Dv)[:, :T]  # [B, T, H, Dv]
    return o.to(out_dtype), S


def chunk_decay_additive(q, k, v, g=None, initial_state=None, scale=None, chunk_size=64):
    """S_t = exp(g_t) * S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t), chunked. -> (o, final_state)"""
    fn = _kernel("chunk_decay_additive", q)
    if fn is not None:
        return fn(q, k, v, g, initial_state, scale)
    return _chunked(q, k, v, None, g, initial_state, scale, chunk_size)


def chunk_delta_rule(q, k, v, beta, g=None, initial_state=None, scale=None, chunk_size=64):
    """S_t = exp(g_t) S_{t-1}; S_t += beta_t k_t (v_t - S_t^T k_t)^T; o_t = S_t^T (scale q_t), chunked."""
    fn = _kernel("chunk_delta_rule", q)
    if fn is not None:
        return fn(q, k, v, beta, g, initial_state, scale)
    return _chunked(q, k, v, beta, g, initial_state, scale, chunk_size)


# ---------------------------------------------------------------------------------------------
# How the two mixers with a twist map onto the families.


def retnet_log_decay(n_head, dtype=torch.float32, device=None):
    """log gamma_h = log(1 - 2^(-5-h)) [H], through log1p: exact near gamma = 1."""
    return torch.log1p(-(2.0 ** (-5.0 - torch.arange(n_head, dtype=dtype, device=device))))


def mlstm_family(q, k, v, i_pre, f_pre, initial_state=None, scale=None, step=False):
    """mLSTM as a decayed additive recurrence, equal to mlstm_recurrent.
    Decay g = log f (per head). The input gate goes into the key, k' = exp(i~ - MLSTM_CAP) k, and
    v' = [v, 1] makes the last state column the normalizer n. Stabilizer: instead of the running
    max m_t, a fixed m = MLSTM_CAP. The layer soft-caps i~ below MLSTM_CAP, so exp(i~ - m) lies in
    (e^-30, 1): no overflow in fp32 or bf16, no underflow to zero, and a fixed m composes with
    chunks, kernels and decoding for free. Scaling C and n by e^-m turns max(|n^T q|, 1) into
    max(|n'^T q|, e^-m). State [B, H, Dk, Dv + 1] = [C, n] e^-m."""
    k = k * torch.exp(i_pre - MLSTM_CAP)[..., None]  # [B, T, H, Dk], input gate folded in
    v = torch.cat([v, torch.ones_like(v[..., :1])], -1)  # [B, T, H, Dv + 1]
    g = F.logsigmoid(f_pre)  # [B, T, H] log forget gate
    if step:
        o, S = step_decay_additive(q, k, v, g, initial_state, scale)
    else:
        o, S = chunk_decay_additive(q, k, v, g, initial_state, scale)
    out_dtype = o.dtype
    o = o.to(torch.promote_types(o.dtype, torch.float32))  # [B, T, H, Dv + 1]: C^T q and n^T q, times e^-m
    h = o[..., :-1] / o[..., -1:].abs().clamp(min=math.exp(-MLSTM_CAP))
    return h.to(out_dtype), S


def softcap(x, cap=MLSTM_CAP):  # cap * tanh(x / cap): smooth, identity near 0, bounded by cap
    return cap * torch.tanh(x / cap)


# ---------------------------------------------------------------------------------------------
# 4. Mixer layers (the token-mixer protocol of model.py) and building a student.
# Initialization: model.SmolLM2 re-initializes every nn.Linear weight with N(0, 0.02) after the
# layers are built, and student_from_teacher then copies q/k/v/o from the teacher. So a Linear
# weight below starts at N(0, 0.02) in a model; biases and plain Parameters keep the inits here.


class ShortConv(nn.Module):
    """Causal depthwise conv over time (kernel `size`), then SiLU. Decoding keeps the last size-1
    inputs (the tail) instead of the past."""

    def __init__(self, dim, size):
        super().__init__()
        # init: identity (current-token tap 1, others 0), so a new student sees the teacher's
        # q, k, v through SiLU only. <-- vs fla: its default random Conv1d init scrambles them
        w = torch.zeros(dim, size)
        w[:, -1] = 1.0
        self.weight = nn.Parameter(w)  # [dim, size]

    def forward(self, x, tail=None):  # x [B, T, dim], tail [B, size-1, dim] -> y [B, T, dim], tail
        if tail is None:
            tail = x.new_zeros(x.shape[0], self.weight.shape[1] - 1, x.shape[2])
        T, x = x.shape[1], torch.cat([tail.to(x.dtype), x], 1)  # [B, size-1+T, dim]
        if T == 1:  # a decoding step: its `size` inputs times the taps, without a conv's overhead
            acc = torch.promote_types(x.dtype, torch.float32)  # bf16 inputs summed in fp32, as a conv does
            y = (x.to(acc) * self.weight.t().to(acc)).sum(1, keepdim=True)
            return F.silu(y).to(x.dtype), self.last(x)
        y = F.conv1d(x.transpose(1, 2), self.weight[:, None, :].to(x.dtype), groups=x.shape[2])  # [B, dim, T]
        return F.silu(y.transpose(1, 2)), self.last(x)

    def last(self, x):  # the tail after x [B, T, dim] from a zero past: its last size-1 inputs, a new tensor
        n = self.weight.shape[1] - 1
        return F.pad(x[:, max(0, x.shape[1] - n) :], (0, 0, max(0, n - x.shape[1]), 0))


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


def softplus_decay(a, A_log, dt_bias):
    """Mamba-2's log decay -exp(A_log) * softplus(a + dt_bias) <= 0, fp32: a [B, T, H] with A_log
    and dt_bias [H] (Gated DeltaNet), or a [B, T, H, K] with A_log [H] and dt_bias [H * K] (KDA)."""
    kern = _kernels(a)
    if kern is not None:  # one kernel forward, one backward
        return kern.softplus_decay(a, A_log, dt_bias)
    A = A_log.exp().view(-1, *[1] * (a.dim() - 3))  # per head, over a's channels
    return -A * F.softplus(a + dt_bias.view(a.shape[2:]))


def _dt_bias(n):
    """Mamba-2's step init: dt log-uniform in [1e-3, 1e-1], stored as softplus^-1(dt)."""
    dt = torch.exp(torch.empty(n).uniform_(math.log(1e-3), math.log(1e-1)))
    return nn.Parameter(dt + torch.log(-torch.expm1(-dt)))


def _A_log(n):
    """Mamba-2's decay-rate init: A ~ U(0, 16), stored as log A."""
    return nn.Parameter(torch.empty(n).uniform_(0, 16).log())


class MixerLayer(nn.Module):
    """What the seven mixers share: Hugging Face-named projections, the short conv, the decoding
    cache, the output norm and gate. A subclass turns q, k, v and its own projections of x into
    its recurrence in mix()."""

    out_norm = None  # per-head output norm: "rms" or "layer"
    out_gate = None  # per-channel output gate from x: "silu" or "sigmoid"
    x_projs = ()  # the subclass's nn.Linear layers that read x (names of submodules), besides q, k, v
    qk_l2 = False  # L2-normalize q and k per head (after the short conv)

    def __init__(self, config, layer_idx):
        super().__init__()
        C, H, D = config.n_embd, config.n_head, config.head_dim
        self.layer_idx, self.n_head, self.n_kv_head, self.head_dim = layer_idx, H, config.n_kv_head, D
        # every mixer has the teacher's n_head heads of width head_dim: the same state size for all.
        # <-- vs the study's code: head counts differed per mixer (states up to 8x apart)
        self.q_proj = nn.Linear(C, H * D, bias=False)
        self.k_proj = nn.Linear(C, H * D, bias=False)  # one key head per query head
        self.v_proj = nn.Linear(C, H * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        # one switch for every mixer. <-- vs the study's code: only the delta rules had the conv
        self.conv = ShortConv(3 * H * D, config.conv_size) if config.short_conv else None
        if self.out_norm == "rms":  # weight init 1
            self.o_norm = _model().RMSNorm(D, config.rms_eps)
        elif self.out_norm == "layer":  # weight init 1, no bias (xLSTM's multi-head LayerNorm)
            self.o_norm = nn.LayerNorm(D, eps=config.rms_eps, bias=False)
        if self.out_gate:
            self.g_proj = nn.Linear(C, H * D, bias=False)
            self.x_projs = ("g_proj",) + self.x_projs
        self._stacked = None  # (key, weights, their stack) kept by _stack for decoding

    def project(self, x):
        """Every nn.Linear that reads x, in one matmul over their stacked weights (one launch and
        one read of x instead of one each; the same products, biases added after the matmul).
        Returns qkv [B, T, 3 H D] and a dict from each name in x_projs to its output."""
        lins = [self.q_proj, self.k_proj, self.v_proj] + [self.get_submodule(n) for n in self.x_projs]
        ws = [lin.weight for lin in lins]
        pad = -sum(w.shape[0] for w in ws) % 64  # output rows a multiple of 64: GPU matmuls want aligned rows
        y = F.linear(x, self._stack(ws, pad))
        qkv, *outs = y.split([3 * self.n_head * self.head_dim] + [lin.out_features for lin in lins[3:]] + [pad], -1)
        return qkv, {n: o if lin.bias is None else o + lin.bias for n, lin, o in zip(self.x_projs, lins[3:], outs)}

    def _stack(self, ws, pad):
        """The weights ws stacked by rows, then pad zero rows: a new torch.cat each call, except
        in eval mode outside autograd (decoding), where the stack is kept while every weight is
        the same storage at the same version, so a decoding step does not copy the weights.
        Held references keep those storages, and so their addresses, from being reused; in-place
        updates (load_state_dict, optimizer steps) bump the version; a mode switch or a move
        (.to(), .cpu(), .float()) drops the stack. A write through .data, which has its own
        version counter, is not seen: switch modes after one."""
        stack = lambda: torch.cat(ws + [ws[0].new_zeros(pad, ws[0].shape[1])] if pad else ws)  # noqa: E731
        if (self.training or torch.is_grad_enabled() or torch.is_inference_mode_enabled()
                or torch.compiler.is_compiling() or any(w.is_inference() for w in ws)):
            return stack()
        key = tuple((w.data_ptr(), w._version) for w in ws)
        if self._stacked is None or self._stacked[0] != key:
            self._stacked = (key, [w.detach() for w in ws], stack())
        return self._stacked[2]

    def train(self, mode=True):
        self._stacked = None
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):  # every move or cast of the parameters goes through here
        self._stacked = None
        return super()._apply(fn, *args, **kwargs)

    def heads(self, qkv, cache):
        """q, k, v [B, T, H, D] from qkv [B, T, 3 H D]: the short conv (its tail kept in the cache
        for decoding), the cut into heads, and the L2 norms when qk_l2."""
        B, T, _ = qkv.shape
        H, D = self.n_head, self.head_dim
        tail = None if cache is None else cache.get("conv")
        kern = _kernels(qkv) if self.conv is not None and tail is None else None
        if kern is not None:  # conv, SiLU, the cut into contiguous q, k, v and the norms: one kernel
            q, k, v = kern.short_conv(qkv, self.conv.weight, parts=3, l2_parts=2 * self.qk_l2, head_dim=D)
            if cache is not None:
                cache["conv"] = self.conv.last(qkv)
            return q.view(B, T, H, D), k.view(B, T, H, D), v.view(B, T, H, D)
        if self.conv is not None:
            qkv, tail = self.conv(qkv, tail)
            if cache is not None:
                cache["conv"] = tail
        q, k, v = qkv.view(B, T, 3, H, D).unbind(2)  # each [B, T, H, D]
        if self.qk_l2:  # unit keys keep every delta-rule write a contraction (beta |k|^2 <= 1)
            kern = _kernels(q)
            if kern is not None:
                return kern.l2_normalize(q), kern.l2_normalize(k), v
            return F.normalize(q, dim=-1), F.normalize(k, dim=-1), v
        return q, k, v

    def forward(self, x, rope, cache=None):
        """x [B, T, C] -> [B, T, C]. cache: None (training) or this layer's dict: a prefill (T > 1)
        runs the chunked form, T = 1 the step; it holds the state and the conv tail, nothing more."""
        B, T, _ = x.shape
        H, D = self.n_head, self.head_dim
        qkv, p = self.project(x)
        q, k, v = self.heads(qkv, cache)
        state = None if cache is None else cache.get("state")
        o, state = self.mix(p, q, k, v, rope, state, step=cache is not None and T == 1)  # [B, T, H, D]
        if cache is not None:
            cache["state"] = state
        kern = _kernels(o) if self.out_norm == "rms" else None
        z = p["g_proj"].reshape(B, T, H, D) if self.out_gate else None
        if kern is not None:  # norm and gate in one kernel
            o = kern.rms_norm_gate(o, self.o_norm.weight, z, self.out_gate, self.o_norm.eps)
        else:
            if self.out_norm:
                o = self.o_norm(o)
            if self.out_gate == "silu":
                o = o * F.silu(z)
            elif self.out_gate == "sigmoid":
                o = o * torch.sigmoid(z)
        return self.o_proj(o.reshape(B, T, H * D))

    @torch.no_grad()
    def init_from_attention(self, attn):
        """Copy q_proj and o_proj from a teacher attention; expand its grouped k_proj and v_proj so
        that student head h reads teacher KV head h // n_rep (n_rep = n_head // n_kv_head).
        <-- vs the study's code: it repeated 32-row blocks, misaligning 64-wide heads."""
        n_rep = self.n_head // self.n_kv_head
        for name in ("q_proj", "o_proj", "k_proj", "v_proj"):
            src, dst = getattr(attn, name).weight, getattr(self, name).weight
            if name in ("k_proj", "v_proj"):  # [H_kv D, C] -> [H_kv, D, C] -> [H D, C]
                src = src.view(self.n_kv_head, self.head_dim, -1).repeat_interleave(n_rep, 0).flatten(0, 1)
            if src.shape != dst.shape:
                raise ValueError(f"{name}: teacher shape {tuple(src.shape)} != student shape {tuple(dst.shape)}")
            dst.copy_(src)


def _additive(q, k, v, g, state, step):  # the decoding step for one token, else the chunked form
    fn = step_decay_additive if step else chunk_decay_additive
    return fn(q, k, v, g, state)


def _delta(q, k, v, beta, g, state, step):
    fn = step_delta_rule if step else chunk_delta_rule
    return fn(q, k, v, beta, g, state)


class LinearAttention(MixerLayer):
    """Linear attention with a learnable feature map; no decay, no normalizer, no output norm."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.q_map, self.k_map = FeatureMap(self.head_dim), FeatureMap(self.head_dim)

    def mix(self, p, q, k, v, rope, state, step):
        q, k = self.q_map(q), self.k_map(k)
        if NAIVE:
            return linear_attention_recurrent(q, k, v, state)
        return _additive(q, k, v, None, state, step)


class RetNet(MixerLayer):
    """Retention: fixed decay gamma_h per head, RoPE on q and k; RMSNorm times swish gate."""

    out_norm, out_gate = "rms", "silu"

    def mix(self, p, q, k, v, rope, state, step):
        apply_rotary = _model().apply_rotary
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)  # the only student with positions
        if NAIVE:
            return retnet_recurrent(q, k, v, state)
        g = retnet_log_decay(self.n_head, torch.promote_types(q.dtype, torch.float32), q.device)  # [H]
        return _additive(q, k, v, g, state, step)


class GLA(MixerLayer):
    """Gated linear attention: data-dependent decay per key channel; RMSNorm times swish gate."""

    out_norm, out_gate = "rms", "silu"
    x_projs = ("gk_proj.0",)  # the first, low-rank half of gk_proj

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        # rank-16 gate; bias init 0, so with small weights a new student decays by about
        # sigmoid(0)^(1/16) = 0.958 per token: a memory of ~24 tokens
        H, D = self.n_head, self.head_dim
        self.gk_proj = nn.Sequential(nn.Linear(config.n_embd, 16, bias=False), nn.Linear(16, H * D))
        nn.init.zeros_(self.gk_proj[1].bias)

    def mix(self, p, q, k, v, rope, state, step):
        log_a = F.logsigmoid(self.gk_proj[1](p["gk_proj.0"])).view_as(k) / 16  # [B, T, H, Dk]; /16 keeps a near 1
        if NAIVE:
            return gla_recurrent(q, k, v, log_a, state)
        return _additive(q, k, v, log_a, state, step)


class MLSTM(MixerLayer):
    """xLSTM's mLSTM: exponential input gate, sigmoid forget gate, normalizer; per-head LayerNorm
    times sigmoid output gate."""

    out_norm, out_gate = "layer", "sigmoid"
    x_projs = ("i_proj", "f_proj")  # with biases, added after the shared matmul

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        H = self.n_head
        self.i_proj = nn.Linear(config.n_embd, H)  # input gate pre-activation i~, per head
        self.f_proj = nn.Linear(config.n_embd, H)  # forget gate pre-activation f~, per head
        # bias inits: input 0 (i = 1: every token enters at weight one and the normalizer averages,
        # close to what attention does); forget linspace(3, 6) over heads, as in xLSTM-7B
        # (f = 0.95 .. 0.998, memories of ~20 to ~400 tokens)
        nn.init.zeros_(self.i_proj.bias)
        with torch.no_grad():
            self.f_proj.bias.copy_(torch.linspace(3.0, 6.0, H))

    def mix(self, p, q, k, v, rope, state, step):
        i_pre, f_pre = softcap(p["i_proj"]), softcap(p["f_proj"])  # [B, T, H] each
        if NAIVE:
            return mlstm_recurrent(q, k, v, i_pre, f_pre, state)
        return mlstm_family(q, k, v, i_pre, f_pre, state, step=step)


class DeltaNet(MixerLayer):
    """DeltaNet: the delta rule with L2-normalized q, k and a learned step beta; per-head RMSNorm."""

    out_norm, qk_l2, x_projs = "rms", True, ("b_proj",)

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.b_proj = nn.Linear(config.n_embd, self.n_head, bias=False)  # beta = sigmoid(.) ~ 0.5 at init

    def mix(self, p, q, k, v, rope, state, step):
        beta = torch.sigmoid(p["b_proj"])  # [B, T, H]
        if NAIVE:
            return deltanet_recurrent(q, k, v, beta, state)
        return _delta(q, k, v, beta, None, state, step)


class GatedDeltaNet(DeltaNet):
    """Gated DeltaNet: DeltaNet with a data-dependent decay per head; RMSNorm times swish gate."""

    out_gate = "silu"
    x_projs = DeltaNet.x_projs + ("a_proj",)

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.a_proj = nn.Linear(config.n_embd, self.n_head, bias=False)
        self.A_log, self.dt_bias = _A_log(self.n_head), _dt_bias(self.n_head)  # Mamba-2 inits

    def mix(self, p, q, k, v, rope, state, step):
        beta = torch.sigmoid(p["b_proj"])  # [B, T, H]
        log_a = softplus_decay(p["a_proj"], self.A_log, self.dt_bias)  # [B, T, H], <= 0
        if NAIVE:
            return gated_deltanet_recurrent(q, k, v, beta, log_a, state)
        return _delta(q, k, v, beta, log_a, state, step)


class KDA(DeltaNet):
    """Kimi Delta Attention: the delta rule after a data-dependent decay per key channel;
    RMSNorm times sigmoid gate. <-- vs the study's code: the gate multiplies the normed output
    (its code added it into the RMSNorm instead)."""

    out_gate = "sigmoid"
    x_projs = DeltaNet.x_projs + ("f_proj.0",)

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        H, D = self.n_head, self.head_dim
        # low-rank decay projection (rank head_dim, as in Kimi Linear); A per head, dt per channel
        self.f_proj = nn.Sequential(nn.Linear(config.n_embd, D, bias=False), nn.Linear(D, H * D, bias=False))
        self.A_log, self.dt_bias = _A_log(H), _dt_bias(H * D)

    def mix(self, p, q, k, v, rope, state, step):
        beta = torch.sigmoid(p["b_proj"])  # [B, T, H]
        log_a = softplus_decay(self.f_proj[1](p["f_proj.0"]).view_as(k), self.A_log, self.dt_bias)  # [B, T, H, Dk]
        if NAIVE:
            return kda_recurrent(q, k, v, beta, log_a, state)
        return _delta(q, k, v, beta, log_a, state, step)


LAYERS = dict(zip(MIXERS, (LinearAttention, RetNet, GLA, MLSTM, DeltaNet, GatedDeltaNet, KDA)))


def build_mixer(config, layer_idx):
    """The token mixer named config.mixer for layer layer_idx."""
    if config.mixer not in LAYERS:
        raise ValueError(f"unknown mixer {config.mixer!r}; valid mixers: {', '.join(MIXERS)}")
    return LAYERS[config.mixer](config, layer_idx)


def student_from_teacher(teacher, mixer, **config_overrides):
    """A student model.SmolLM2 whose layers use `mixer`, initialized from the teacher: every
    teacher tensor is either copied to the same name and shape or consumed by a mixer layer's
    init_from_attention; every student tensor the teacher lacks belongs to a mixer layer."""
    config = dataclasses.replace(teacher.config, mixer=mixer, **config_overrides)
    p = next(teacher.parameters())
    student = _model().SmolLM2(config).to(device=p.device, dtype=p.dtype)
    own, theirs = student.state_dict(), teacher.state_dict()
    consumed, new = set(), set()
    for i, layer in enumerate(student.model.layers):
        if isinstance(layer.self_attn, MixerLayer):
            attn = teacher.model.layers[i].self_attn
            layer.self_attn.init_from_attention(attn)
            prefix = f"model.layers.{i}.self_attn."
            consumed |= {prefix + name for name in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")}
            new |= {prefix + name for name in layer.self_attn.state_dict()}
    with torch.no_grad():
        for key, value in theirs.items():
            if key in consumed:
                continue
            if key not in own or own[key].shape != value.shape:
                shape = tuple(own[key].shape) if key in own else "absent"
                raise ValueError(f"teacher tensor {key} {tuple(value.shape)} has no student match ({shape})")
            own[key].copy_(value)
    orphans = set(own) - set(theirs) - new
    if orphans:
        raise ValueError(f"student tensors neither copied nor new in a mixer: {sorted(orphans)[:5]}")
    return student
