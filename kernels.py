"""
Chunked Triton kernels for the linear recurrences of mixers.py, forward and backward.

Each public function has the signature and the semantics of its chunked PyTorch twin in
mixers.py, works on q, k [B, T, H, Dk], v [B, T, H, Dv] and states [B, H, Dk, Dv] (fp32),
returns (output, final_state), accepts any T (not only chunk multiples) and is a
torch.autograd.Function with hand-written backward kernels.

    chunk_decay_additive   S_t = exp(g_t) * S_{t-1} + k_t v_t^T ;  o_t = S_t^T (scale q_t)
                           (linear attention, RetNet, mLSTM, GLA)

The kernels run compiled on a GPU and, with TRITON_INTERPRET=1, on the CPU, which is how
the tests check them against the token-by-token references of mixers.py.

Naming inside kernels (the flash-linear-attention convention):
    i_  program ids and loop indices      o_  offsets (aranges)      m_  masks
    p_  pointers (tensors of addresses)   b_  block values held in registers
    B, T, H, K, V  batch, time, heads, key width Dk, value width Dv
    BT  chunk length, BC  sub-chunk length, BK / BV  key / value block widths, NT chunks

References:
1) Yang et al., "Gated Linear Attention Transformers with Hardware-Efficient Training"
   (arXiv 2312.06635): the chunked form, the state materialised once per chunk, and the
   secondary sub-chunk level for per-channel decays.
2) flash-linear-attention (github.com/fla-org/flash-linear-attention): the kernel split
   (chunk states / outputs / state gradients / dv / dq dk dg) and the naming above.
3) Sun et al., "Retentive Network" (arXiv 2307.08621); Beck et al., "xLSTM"
   (arXiv 2405.04517): the constant and the scalar data-dependent decays.

Sections:
    1. Shared helpers
    2. Decayed-additive family: kernels, autograd Function, chunk_decay_additive
"""

import torch
import triton
import triton.language as tl

# -----------------------------------------------------------------------------
# 1. Shared helpers


def _pow2(n, lo=16):
    """Smallest power of two >= n, and at least lo (tl.dot needs every side >= 16)."""
    return max(lo, triton.next_power_of_2(n))


def _check_qkv(q, k, v):
    """Assert the shared layout: q, k [B, T, H, Dk] and v [B, T, H, Dv], one device."""
    assert q.dim() == 4 and q.shape == k.shape, f"q {tuple(q.shape)} and k {tuple(k.shape)} must be [B,T,H,Dk]"
    assert v.dim() == 4 and v.shape[:3] == q.shape[:3], f"v {tuple(v.shape)} must be [B,T,H,Dv] like q"
    assert q.device == k.device == v.device, "q, k, v must live on one device"


# -----------------------------------------------------------------------------
# 2. Decayed-additive family
#
# Per chunk c of BT positions, with G the cumulative log decay inside the chunk
# (G_i = g_{c0} + ... + g_i, so G is non-increasing and G_L, at the chunk's last row,
# is the whole chunk's decay) and h_c the state entering the chunk:
#     O       = scale * [ (Q * exp(G)) h_c + (tril(Q K^T) * exp(G_i - G_j)) V ]
#     h_{c+1} = exp(G_L) * h_c + (K * exp(G_L - G))^T V
# Every exponent the kernels take is <= 0 (differences "later minus earlier" of G),
# so no gate, however extreme, overflows.
#
# The gate g comes in four granularities, a constexpr GATE in every kernel:
#     0  none                       linear attention
#     1  [H]        constant/head   RetNet
#     2  [B, T, H]  scalar/head     mLSTM (input gate folded into k by the caller)
#     3  [B, T, H, K] per channel   GLA
# Scalar gates (1, 2) commute with the matmuls: the kernels multiply whole rows or the
# [BT, BT] score matrix after the dot. Per-channel gates (3) do not: exp(G_i - G_j) is a
# different factor in every key channel. Those kernels split the chunk into sub-chunks of
# BC = 16 rows; a pair of different sub-chunks (I later than J) is one dot of
# Q_I * exp(G_I - G_r) with K_J * exp(G_r - G_J), where r is the first row of I (both
# factors <= 1); a diagonal sub-chunk is summed exactly in fp32, one key row at a time.
#
# Backward (gradients of the chunk formulas above):
#     dh_c   = exp(G_L) * dh_{c+1} + (scale Q * exp(G))^T dO           (reverse over chunks)
#     dV     = (scale tril(QK^T) * exp(G_i - G_j))^T dO + (K * exp(G_L - G)) dh_{c+1}
#     dQ     = scale [ (dO h_c^T) * exp(G) + (tril(dO V^T) * exp(G_i - G_j)) K ]
#     dK     = (tril(dO V^T) * exp(G_i - G_j))^T (scale Q) + (V dh_{c+1}^T) * exp(G_L - G)
#     dlogdecay: every term holding q_i has a factor exp(G_i), every term holding k_j a
#     factor exp(-G_j), and all of h_{c+1} a factor exp(G_L), so
#         dG_i = q_i * dq_i - k_i * dk_i  (+ rowsum(h_{c+1} * dh_{c+1}) at i = L)
#     and dg_u = sum_{i >= u in the chunk} dG_i: a reverse cumulative sum inside the chunk
#     (the state gradient dh_{c+1} already carries everything later chunks need).

_ADD_BC = 16  # sub-chunk rows for per-channel decays; tl.dot's smallest side


@triton.jit
def _add_scalar_gates(g, i_b, i_h, i_t, T, H: tl.constexpr, BT: tl.constexpr, GATE: tl.constexpr):
    """Cumulative log decay G [BT] of one chunk for scalar gates (GATE 1 or 2).

    Rows past T count as g = 0, so G stays at G_L there and the chunk's total is G[BT-1].
    """
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    if GATE == 1:
        # one constant log decay per head, the same at every position
        b_g = tl.where(m_t, tl.load(g + i_h).to(tl.float32), 0.0)
    else:
        # g [B, T, H]: one log decay per position and head
        b_g = tl.load(g + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.0).to(tl.float32)
    return tl.cumsum(b_g, axis=0)  # [BT]


@triton.jit
def _add_chunk_cumsum_kernel(g, gc, T, Tp, H: tl.constexpr, K: tl.constexpr,
                             BT: tl.constexpr, BK: tl.constexpr):
    """Per-channel gates: gc[b, t, h, :] = cumulative sum of g inside t's chunk, in fp32.

    gc has Tp = NT * BT rows; the padding rows repeat the chunk's last value (g = 0 there),
    so every later kernel may read G at any row of a chunk without masks or special cases.
    """
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    p_g = g + ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    b_g = tl.load(p_g, mask=(o_t[:, None] < T) & m_k[None, :], other=0.0).to(tl.float32)
    p_gc = gc + ((i_b * Tp + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    tl.store(p_gc, tl.cumsum(b_g, axis=0), mask=m_k[None, :])  # [BT, BK]


@triton.jit
def _add_fwd_state_kernel(k, v, g, h0, hs, ht, T, Tp, NT,
                          H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                          GATE: tl.constexpr, HAS_H0: tl.constexpr):
    """Walk the chunks in order; store the state entering each chunk in hs[b, h, c].

    hs [B, H, NT+1, K, V] in the inputs' dtype (slot NT = final state, read by the
    backward's gate gradient); ht [B, H, K, V] the final state in fp32.
    One program owns one [BK, BV] tile of one (batch, head)'s state.
    """
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]  # [BK, BV] offsets inside one state
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_H0:
        b_h += tl.load(h0 + i_bh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.0)
    p_hs = hs + i_bh.to(tl.int64) * (NT + 1) * K * V + o_kv
    for i_t in range(NT):
        tl.store(p_hs + i_t * K * V, b_h.to(hs.dtype.element_ty), mask=m_kv)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        # k loaded transposed, [BK, BT], so that k^T v is a plain dot
        p_k = k + ((i_b * T + o_t[None, :]) * H + i_h).to(tl.int64) * K + o_k[:, None]
        b_kt = tl.load(p_k, mask=m_k[:, None] & m_t[None, :], other=0.0)
        p_v = v + ((i_b * T + o_t[:, None]) * H + i_h).to(tl.int64) * V + o_v[None, :]
        b_v = tl.load(p_v, mask=m_t[:, None] & m_v[None, :], other=0.0)  # [BT, BV]
        if GATE == 3:
            # per-channel: G^T [BK, BT] from the chunk-cumsum buffer, G_L its last column
            p_g = g + ((i_b * Tp + o_t[None, :]) * H + i_h).to(tl.int64) * K + o_k[:, None]
            b_gt = tl.load(p_g, mask=m_k[:, None], other=0.0)
            p_gl = g + ((i_b * Tp + i_t * BT + BT - 1) * H + i_h).to(tl.int64) * K + o_k
            b_gl = tl.load(p_gl, mask=m_k, other=0.0)  # [BK]
            b_kt = (b_kt * tl.exp(b_gl[:, None] - b_gt)).to(b_v.dtype)  # exponent <= 0
            b_h *= tl.exp(b_gl)[:, None]
        elif GATE > 0:
            # scalar: decay the rows of v instead of k, one factor per position
            b_g = _add_scalar_gates(g, i_b, i_h, i_t, T, H, BT, GATE)  # [BT]
            b_gl = tl.sum(tl.where(tl.arange(0, BT) == BT - 1, b_g, 0.0), axis=0)
            b_v = (b_v * tl.exp(b_gl - b_g)[:, None]).to(b_kt.dtype)
            b_h *= tl.exp(b_gl)
        b_h += tl.dot(b_kt, b_v)  # [BK, BT] @ [BT, BV]
    tl.store(p_hs + NT * K * V, b_h.to(hs.dtype.element_ty), mask=m_kv)
    tl.store(ht + i_bh.to(tl.int64) * K * V + o_kv, b_h, mask=m_kv)


@triton.jit
def _add_fwd_out_kernel(q, k, v, g, hs, o, scale, T, NT,
                        H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        GATE: tl.constexpr):
    """Outputs of one chunk for no gate or scalar gates (GATE 0, 1, 2).

    O = scale * [ exp(G) * (Q h_c) + (mask * exp(G_i - G_j) * (Q K^T)) V ]
    One program per (value block, chunk, batch*head); the key width is looped over.
    """
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_i = tl.arange(0, BT)
    o_t = i_t * BT + o_i
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_v = o_t < T, o_v < V
    o_row = ((i_b * T + o_t) * H + i_h).to(tl.int64)  # [BT] row index into q, k, v, o
    p_h = hs + (i_bh.to(tl.int64) * (NT + 1) + i_t) * K * V
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(q + o_row[:, None] * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_kt = tl.load(k + o_row[None, :] * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        b_h = tl.load(p_h + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o += tl.dot(b_q, b_h.to(b_q.dtype))  # [BT, BK] @ [BK, BV], inter-chunk
        b_A += tl.dot(b_q, b_kt)  # [BT, BK] @ [BK, BT], intra-chunk scores
    m_A = o_i[:, None] >= o_i[None, :]  # causal, diagonal included
    if GATE > 0:
        b_g = _add_scalar_gates(g, i_b, i_h, i_t, T, H, BT, GATE)
        b_o *= tl.exp(b_g)[:, None]
        # masking the exponent (not the result) keeps exp away from positive numbers
        b_A *= tl.exp(tl.where(m_A, b_g[:, None] - b_g[None, :], float("-inf")))
    else:
        b_A = tl.where(m_A, b_A, 0.0)
    b_v = tl.load(v + o_row[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
    b_o += tl.dot(b_A.to(b_v.dtype), b_v)  # [BT, BT] @ [BT, BV]
    tl.store(o + o_row[:, None] * V + o_v[None, :], (b_o * scale).to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])


@triton.jit
def _add_fwd_out_channel_kernel(q, k, v, g, hs, o, scale, T, Tp, NT,
                                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                                BV: tl.constexpr):
    """Outputs of one sub-chunk I of BC rows for per-channel gates (GATE 3).

    One program per (value block, chunk * sub-chunk, batch * head); BK covers all of K.
    The state term, then one dot per earlier sub-chunk J against a reference row r (first
    row of I), then the diagonal sub-chunk exactly, key row by key row.
    """
    i_v, i_tc, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_t, i_i = i_tc // (BT // BC), i_tc % (BT // BC)  # chunk, row sub-chunk I
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    b_h = tl.load(hs + (i_bh.to(tl.int64) * (NT + 1) + i_t) * K * V + o_k[:, None] * V + o_v[None, :],
                  mask=m_k[:, None] & m_v[None, :], other=0.0)  # [BK, BV]
    o_ti = i_t * BT + i_i * BC + o_c
    m_ti = o_ti < T
    o_rq = ((i_b * T + o_ti) * H + i_h).to(tl.int64)  # rows of q, o
    o_rg = ((i_b * Tp + o_ti) * H + i_h).to(tl.int64)  # rows of the padded G
    b_q = tl.load(q + o_rq[:, None] * K + o_k[None, :], mask=m_ti[:, None] & m_k[None, :], other=0.0)
    b_q = b_q.to(tl.float32) * scale
    b_g = tl.load(g + o_rg[:, None] * K + o_k[None, :], mask=m_k[None, :], other=0.0)  # [BC, BK]
    # state entering the chunk: (q * exp(G)) h_c
    b_o = tl.dot((b_q * tl.exp(b_g)).to(b_h.dtype), b_h)  # [BC, BV]
    # earlier sub-chunks J < I, rescaled against the first row r of I
    b_gr = tl.load(g + ((i_b * Tp + i_t * BT + i_i * BC) * H + i_h).to(tl.int64) * K + o_k,
                   mask=m_k, other=0.0)  # [BK]
    b_qr = (b_q * tl.exp(b_g - b_gr[None, :])).to(b_h.dtype)  # exp(G_i - G_r) <= 1
    for i_j in range(i_i):
        o_tj = i_t * BT + i_j * BC + o_c
        m_tj = o_tj < T
        o_rk = ((i_b * T + o_tj) * H + i_h).to(tl.int64)
        b_k = tl.load(k + o_rk[:, None] * K + o_k[None, :], mask=m_tj[:, None] & m_k[None, :], other=0.0)
        b_gk = tl.load(g + ((i_b * Tp + o_tj) * H + i_h).to(tl.int64)[:, None] * K + o_k[None, :],
                       mask=m_k[None, :], other=0.0)
        b_kr = (b_k * tl.exp(b_gr[None, :] - b_gk)).to(b_h.dtype)  # exp(G_r - G_j) <= 1
        b_v = tl.load(v + o_rk[:, None] * V + o_v[None, :], mask=m_tj[:, None] & m_v[None, :], other=0.0)
        b_A = tl.dot(b_qr, tl.trans(b_kr))  # [BC, BC]
        b_o += tl.dot(b_A.to(b_v.dtype), b_v)
    # the diagonal sub-chunk, exact: column j of the scores, then its rank-1 update
    for j in tl.static_range(BC):
        o_tj = i_t * BT + i_i * BC + j
        o_rk = ((i_b * T + o_tj) * H + i_h).to(tl.int64)
        b_kj = tl.load(k + o_rk * K + o_k, mask=m_k & (o_k * 0 + o_tj < T), other=0.0).to(tl.float32)
        b_gj = tl.load(g + ((i_b * Tp + o_tj) * H + i_h).to(tl.int64) * K + o_k, mask=m_k, other=0.0)
        b_vj = tl.load(v + o_rk * V + o_v, mask=m_v & (o_v * 0 + o_tj < T), other=0.0).to(tl.float32)
        b_decay = tl.exp(tl.where((o_c >= j)[:, None], b_g - b_gj[None, :], float("-inf")))
        b_a = tl.sum(b_q * b_kj[None, :] * b_decay, axis=1)  # [BC]
        b_o += b_a[:, None] * b_vj[None, :]
    tl.store(o + o_rq[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m_ti[:, None] & m_v[None, :])


@triton.jit
def _add_bwd_state_kernel(q, g, do, dht, dhs, dh0, scale, T, Tp, NT,
                          H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                          GATE: tl.constexpr, HAS_DHT: tl.constexpr, HAS_H0: tl.constexpr):
    """Walk the chunks backwards; store the gradient of the state leaving each chunk.

    dhs[b, h, c] = dL/dh_{c+1} (inputs' dtype); dh0 = dL/dh_0 in fp32.
    dh_c = exp(G_L) * dh_{c+1} + (scale Q * exp(G))^T dO
    """
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_DHT:
        b_dh += tl.load(dht + i_bh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.0)
    p_dhs = dhs + i_bh.to(tl.int64) * NT * K * V + o_kv
    for i_r in range(NT):
        i_t = NT - 1 - i_r
        tl.store(p_dhs + i_t * K * V, b_dh.to(dhs.dtype.element_ty), mask=m_kv)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        p_q = q + ((i_b * T + o_t[None, :]) * H + i_h).to(tl.int64) * K + o_k[:, None]
        b_qt = tl.load(p_q, mask=m_k[:, None] & m_t[None, :], other=0.0)  # [BK, BT]
        p_do = do + ((i_b * T + o_t[:, None]) * H + i_h).to(tl.int64) * V + o_v[None, :]
        b_do = tl.load(p_do, mask=m_t[:, None] & m_v[None, :], other=0.0)  # [BT, BV]
        if GATE == 3:
            p_g = g + ((i_b * Tp + o_t[None, :]) * H + i_h).to(tl.int64) * K + o_k[:, None]
            b_gt = tl.load(p_g, mask=m_k[:, None], other=0.0)  # [BK, BT]
            p_gl = g + ((i_b * Tp + i_t * BT + BT - 1) * H + i_h).to(tl.int64) * K + o_k
            b_gl = tl.load(p_gl, mask=m_k, other=0.0)
            b_qt = (b_qt * tl.exp(b_gt) * scale).to(b_do.dtype)
            b_dh *= tl.exp(b_gl)[:, None]
        elif GATE > 0:
            b_g = _add_scalar_gates(g, i_b, i_h, i_t, T, H, BT, GATE)
            b_gl = tl.sum(tl.where(tl.arange(0, BT) == BT - 1, b_g, 0.0), axis=0)
            b_do = (b_do * (tl.exp(b_g) * scale)[:, None]).to(b_qt.dtype)
            b_dh *= tl.exp(b_gl)
        else:
            b_qt = (b_qt * scale).to(b_do.dtype)
        b_dh += tl.dot(b_qt, b_do)  # [BK, BT] @ [BT, BV]
    if HAS_H0:
        tl.store(dh0 + i_bh.to(tl.int64) * K * V + o_kv, b_dh, mask=m_kv)


@triton.jit
def _add_bwd_dv_kernel(q, k, g, do, dhs, dv, scale, T, NT,
                       H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       GATE: tl.constexpr):
    """dV of one chunk for no gate or scalar gates (GATE 0, 1, 2).

    dV = exp(G_L - G) * (K dh_{c+1}) + (scale * mask * exp(G_i - G_j) * (QK^T))^T dO,
    with the transposed scores built directly as A^T = K Q^T.
    """
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_i = tl.arange(0, BT)
    o_t = i_t * BT + o_i
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_v = o_t < T, o_v < V
    o_row = ((i_b * T + o_t) * H + i_h).to(tl.int64)
    p_dh = dhs + (i_bh.to(tl.int64) * NT + i_t) * K * V
    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    b_At = tl.zeros([BT, BT], dtype=tl.float32)  # b_At[j, i] = k_j . q_i
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_k = tl.load(k + o_row[:, None] * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_qt = tl.load(q + o_row[None, :] * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        b_dh = tl.load(p_dh + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_dv += tl.dot(b_k, b_dh.to(b_k.dtype))  # [BT, BK] @ [BK, BV]
        b_At += tl.dot(b_k, b_qt)  # [BT, BK] @ [BK, BT]
    m_A = o_i[:, None] <= o_i[None, :]  # key j feeds query i >= j
    if GATE > 0:
        b_g = _add_scalar_gates(g, i_b, i_h, i_t, T, H, BT, GATE)
        b_gl = tl.sum(tl.where(o_i == BT - 1, b_g, 0.0), axis=0)
        b_dv *= tl.exp(b_gl - b_g)[:, None]
        b_At *= tl.exp(tl.where(m_A, b_g[None, :] - b_g[:, None], float("-inf"))) * scale
    else:
        b_At = tl.where(m_A, b_At * scale, 0.0)
    b_do = tl.load(do + o_row[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
    b_dv += tl.dot(b_At.to(b_do.dtype), b_do)  # [BT, BT] @ [BT, BV]
    tl.store(dv + o_row[:, None] * V + o_v[None, :], b_dv.to(dv.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])


@triton.jit
def _add_bwd_dqk_kernel(q, k, v, g, do, hs, dhs, dq, dk, dg, scale, T, NT,
                        H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        GATE: tl.constexpr):
    """dQ, dK and the scalar gates' dg of one chunk (GATE 0, 1, 2), one key block.

    dg [NK, B, T, H] holds this key block's share of the gate gradient; the wrapper sums
    the NK shares (one when K fits one block).
    """
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_i = tl.arange(0, BT)
    o_t = i_t * BT + o_i
    o_k = i_k * BK + tl.arange(0, BK)
    m_t, m_k = o_t < T, o_k < K
    o_row = ((i_b * T + o_t) * H + i_h).to(tl.int64)
    p_h = hs + (i_bh.to(tl.int64) * (NT + 1) + i_t) * K * V  # state entering the chunk
    p_dh = dhs + (i_bh.to(tl.int64) * NT + i_t) * K * V  # gradient of the state leaving it
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)  # dO V^T
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_dgl = tl.zeros([BK], dtype=tl.float32)  # rowsum(h_{c+1} * dh_{c+1})
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_kv = m_k[:, None] & m_v[None, :]
        b_v = tl.load(v + o_row[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
        b_do = tl.load(do + o_row[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
        b_h = tl.load(p_h + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)  # [BK, BV]
        b_dh = tl.load(p_dh + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
        b_dA += tl.dot(b_do, tl.trans(b_v))  # [BT, BV] @ [BV, BT]
        b_dq += tl.dot(b_do, tl.trans(b_h).to(b_do.dtype))  # [BT, BV] @ [BV, BK]
        b_dk += tl.dot(b_v, tl.trans(b_dh).to(b_v.dtype))
        if GATE > 0:
            b_hn = tl.load(p_h + K * V + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
            b_dgl += tl.sum(b_hn.to(tl.float32) * b_dh.to(tl.float32), axis=1)
    m_A = o_i[:, None] >= o_i[None, :]
    if GATE > 0:
        b_g = _add_scalar_gates(g, i_b, i_h, i_t, T, H, BT, GATE)
        b_gl = tl.sum(tl.where(o_i == BT - 1, b_g, 0.0), axis=0)
        b_dq *= tl.exp(b_g)[:, None]
        b_dk *= tl.exp(b_gl - b_g)[:, None]
        b_dA *= tl.exp(tl.where(m_A, b_g[:, None] - b_g[None, :], float("-inf")))
    else:
        b_dA = tl.where(m_A, b_dA, 0.0)
    m_tk = m_t[:, None] & m_k[None, :]
    b_q = tl.load(q + o_row[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
    b_k = tl.load(k + o_row[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
    b_dq = (b_dq + tl.dot(b_dA.to(b_k.dtype), b_k)) * scale  # [BT, BT] @ [BT, BK]
    b_dk += tl.dot(tl.trans(b_dA).to(b_q.dtype), b_q) * scale
    tl.store(dq + o_row[:, None] * K + o_k[None, :], b_dq.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + o_row[:, None] * K + o_k[None, :], b_dk.to(dk.dtype.element_ty), mask=m_tk)
    if GATE > 0:
        # dG_i = sum over channels of (q dq - k dk), then the reverse cumsum in the chunk
        b_dG = tl.sum(b_q.to(tl.float32) * b_dq - b_k.to(tl.float32) * b_dk, axis=1)  # [BT]
        b_dg = tl.sum(b_dG, axis=0) - tl.cumsum(b_dG, axis=0) + b_dG + tl.sum(b_dgl, axis=0)
        p_dg = dg + i_k.to(tl.int64) * T * tl.num_programs(2) + (i_b * T + o_t) * H + i_h
        tl.store(p_dg, b_dg, mask=m_t)


@triton.jit
def _add_bwd_dv_channel_kernel(q, k, g, do, dhs, dv, scale, T, Tp, NT,
                               H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                               BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                               BV: tl.constexpr):
    """dV of one sub-chunk I of key rows for per-channel gates (GATE 3).

    One program per (value block, chunk * sub-chunk, batch * head); BK covers all of K.
    The state-gradient term, one dot per later sub-chunk J (reference row r = first row
    of J), then the diagonal exactly.
    """
    i_v, i_tc, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_t, i_i = i_tc // (BT // BC), i_tc % (BT // BC)  # chunk, key sub-chunk I
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    b_dh = tl.load(dhs + (i_bh.to(tl.int64) * NT + i_t) * K * V + o_k[:, None] * V + o_v[None, :],
                   mask=m_k[:, None] & m_v[None, :], other=0.0)  # [BK, BV]
    b_gl = tl.load(g + ((i_b * Tp + i_t * BT + BT - 1) * H + i_h).to(tl.int64) * K + o_k,
                   mask=m_k, other=0.0)  # [BK]
    o_ti = i_t * BT + i_i * BC + o_c
    m_ti = o_ti < T
    o_rk = ((i_b * T + o_ti) * H + i_h).to(tl.int64)
    b_k = tl.load(k + o_rk[:, None] * K + o_k[None, :], mask=m_ti[:, None] & m_k[None, :], other=0.0)
    b_k = b_k.to(tl.float32)
    b_g = tl.load(g + ((i_b * Tp + o_ti) * H + i_h).to(tl.int64)[:, None] * K + o_k[None, :],
                  mask=m_k[None, :], other=0.0)  # [BC, BK]
    # the state leaving the chunk: (k * exp(G_L - G)) dh_{c+1}
    b_dv = tl.dot((b_k * tl.exp(b_gl[None, :] - b_g)).to(b_dh.dtype), b_dh)  # [BC, BV]
    # later sub-chunks J > I (queries), rescaled against the first row r of J
    for i_j in range(i_i + 1, BT // BC):
        o_tj = i_t * BT + i_j * BC + o_c
        m_tj = o_tj < T
        o_rq = ((i_b * T + o_tj) * H + i_h).to(tl.int64)
        b_qj = tl.load(q + o_rq[:, None] * K + o_k[None, :], mask=m_tj[:, None] & m_k[None, :], other=0.0)
        b_gj = tl.load(g + ((i_b * Tp + o_tj) * H + i_h).to(tl.int64)[:, None] * K + o_k[None, :],
                       mask=m_k[None, :], other=0.0)
        b_gr = tl.load(g + ((i_b * Tp + i_t * BT + i_j * BC) * H + i_h).to(tl.int64) * K + o_k,
                       mask=m_k, other=0.0)
        b_qr = (b_qj * tl.exp(b_gj - b_gr[None, :]) * scale).to(b_dh.dtype)
        b_kr = (b_k * tl.exp(b_gr[None, :] - b_g)).to(b_dh.dtype)
        b_doj = tl.load(do + o_rq[:, None] * V + o_v[None, :], mask=m_tj[:, None] & m_v[None, :], other=0.0)
        b_At = tl.dot(b_kr, tl.trans(b_qr))  # [BC keys, BC queries]
        b_dv += tl.dot(b_At.to(b_doj.dtype), b_doj)
    # the diagonal sub-chunk, exact: one query row j at a time
    for j in tl.static_range(BC):
        o_tj = i_t * BT + i_i * BC + j
        o_rq = ((i_b * T + o_tj) * H + i_h).to(tl.int64)
        b_qj = tl.load(q + o_rq * K + o_k, mask=m_k & (o_k * 0 + o_tj < T), other=0.0).to(tl.float32) * scale
        b_gj = tl.load(g + ((i_b * Tp + o_tj) * H + i_h).to(tl.int64) * K + o_k, mask=m_k, other=0.0)
        b_doj = tl.load(do + o_rq * V + o_v, mask=m_v & (o_v * 0 + o_tj < T), other=0.0).to(tl.float32)
        b_decay = tl.exp(tl.where((o_c <= j)[:, None], b_gj[None, :] - b_g, float("-inf")))
        b_a = tl.sum(b_k * b_qj[None, :] * b_decay, axis=1)  # [BC]: A[j, keys]
        b_dv += b_a[:, None] * b_doj[None, :]
    tl.store(dv + o_rk[:, None] * V + o_v[None, :], b_dv.to(dv.dtype.element_ty),
             mask=m_ti[:, None] & m_v[None, :])


@triton.jit
def _add_bwd_dqk_channel_kernel(q, k, v, g, do, hs, dhs, dq, dk, dg, scale, T, Tp, NT,
                                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                                BV: tl.constexpr):
    """dQ, dK and dG = q dq - k dk of one sub-chunk for per-channel gates (GATE 3).

    One program per (key block, chunk * sub-chunk, batch * head); BV covers all of V
    because the scores' gradient dO V^T needs every value channel. dG (fp32) becomes dg
    in _add_channel_dg_kernel, which adds the reverse cumulative sum over the chunk.
    """
    i_k, i_tc, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_t, i_i = i_tc // (BT // BC), i_tc % (BT // BC)  # chunk, row sub-chunk I
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, BC)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    # states as [BV, BK] (transposed) so that dO h^T and V dh^T are plain dots
    o_vk = o_k[None, :] * V + o_v[:, None]
    m_vk = m_v[:, None] & m_k[None, :]
    b_ht = tl.load(hs + (i_bh.to(tl.int64) * (NT + 1) + i_t) * K * V + o_vk, mask=m_vk, other=0.0)
    b_dht = tl.load(dhs + (i_bh.to(tl.int64) * NT + i_t) * K * V + o_vk, mask=m_vk, other=0.0)
    b_gl = tl.load(g + ((i_b * Tp + i_t * BT + BT - 1) * H + i_h).to(tl.int64) * K + o_k,
                   mask=m_k, other=0.0)
    o_ti = i_t * BT + i_i * BC + o_c
    m_ti = o_ti < T
    m_tik = m_ti[:, None] & m_k[None, :]
    m_tiv = m_ti[:, None] & m_v[None, :]
    o_ri = ((i_b * T + o_ti) * H + i_h).to(tl.int64)
    b_q = tl.load(q + o_ri[:, None] * K + o_k[None, :], mask=m_tik, other=0.0).to(tl.float32)
    b_k = tl.load(k + o_ri[:, None] * K + o_k[None, :], mask=m_tik, other=0.0).to(tl.float32)
    b_v = tl.load(v + o_ri[:, None] * V + o_v[None, :], mask=m_tiv, other=0.0)
    b_do = tl.load(do + o_ri[:, None] * V + o_v[None, :], mask=m_tiv, other=0.0)
    b_g = tl.load(g + ((i_b * Tp + o_ti) * H + i_h).to(tl.int64)[:, None] * K + o_k[None, :],
                  mask=m_k[None, :], other=0.0)  # [BC, BK]
    # state terms: dq = (dO h_c^T) exp(G), dk = (V dh_{c+1}^T) exp(G_L - G)
    b_dq = tl.dot(b_do, b_ht.to(b_do.dtype)) * tl.exp(b_g)
    b_dk = tl.dot(b_v, b_dht.to(b_v.dtype)) * tl.exp(b_gl[None, :] - b_g)
    # dq from earlier sub-chunks J < I, reference row r = first row of I
    b_gr = tl.load(g + ((i_b * Tp + i_t * BT + i_i * BC) * H + i_h).to(tl.int64) * K + o_k,
                   mask=m_k, other=0.0)
    b_dqr = tl.zeros([BC, BK], dtype=tl.float32)
    for i_j in range(i_i):
        o_tj = i_t * BT + i_j * BC + o_c
        m_tj = o_tj < T
        o_rj = ((i_b * T + o_tj) * H + i_h).to(tl.int64)
        b_kj = tl.load(k + o_rj[:, None] * K + o_k[None, :], mask=m_tj[:, None] & m_k[None, :], other=0.0)
        b_vj = tl.load(v + o_rj[:, None] * V + o_v[None, :], mask=m_tj[:, None] & m_v[None, :], other=0.0)
        b_gj = tl.load(g + ((i_b * Tp + o_tj) * H + i_h).to(tl.int64)[:, None] * K + o_k[None, :],
                       mask=m_k[None, :], other=0.0)
        b_dA = tl.dot(b_do, tl.trans(b_vj))  # [BC, BC]: dA[i, j] = do_i . v_j
        b_kr = (b_kj * tl.exp(b_gr[None, :] - b_gj)).to(b_do.dtype)
        b_dqr += tl.dot(b_dA.to(b_do.dtype), b_kr)
    b_dq += b_dqr * tl.exp(b_g - b_gr[None, :])
    # dk from later sub-chunks J > I, reference row r = first row of J
    for i_j in range(i_i + 1, BT // BC):
        o_tj = i_t * BT + i_j * BC + o_c
        m_tj = o_tj < T
        o_rj = ((i_b * T + o_tj) * H + i_h).to(tl.int64)
        b_qj = tl.load(q + o_rj[:, None] * K + o_k[None, :], mask=m_tj[:, None] & m_k[None, :], other=0.0)
        b_doj = tl.load(do + o_rj[:, None] * V + o_v[None, :], mask=m_tj[:, None] & m_v[None, :], other=0.0)
        b_gj = tl.load(g + ((i_b * Tp + o_tj) * H + i_h).to(tl.int64)[:, None] * K + o_k[None, :],
                       mask=m_k[None, :], other=0.0)
        b_grj = tl.load(g + ((i_b * Tp + i_t * BT + i_j * BC) * H + i_h).to(tl.int64) * K + o_k,
                        mask=m_k, other=0.0)
        b_dAt = tl.dot(b_v, tl.trans(b_doj))  # [BC, BC]: dA[j, i] stored at [i, j]
        b_qr = (b_qj * tl.exp(b_gj - b_grj[None, :])).to(b_do.dtype)
        b_dk += tl.dot(b_dAt.to(b_do.dtype), b_qr) * tl.exp(b_grj[None, :] - b_g) * scale
    # the diagonal sub-chunk, exact, row j of the sub-chunk at a time
    for j in tl.static_range(BC):
        o_tj = i_t * BT + i_i * BC + j
        o_rj = ((i_b * T + o_tj) * H + i_h).to(tl.int64)
        b_qj = tl.load(q + o_rj * K + o_k, mask=m_k & (o_k * 0 + o_tj < T), other=0.0).to(tl.float32)
        b_kj = tl.load(k + o_rj * K + o_k, mask=m_k & (o_k * 0 + o_tj < T), other=0.0).to(tl.float32)
        b_vj = tl.load(v + o_rj * V + o_v, mask=m_v & (o_v * 0 + o_tj < T), other=0.0).to(tl.float32)
        b_doj = tl.load(do + o_rj * V + o_v, mask=m_v & (o_v * 0 + o_tj < T), other=0.0).to(tl.float32)
        b_gj = tl.load(g + ((i_b * Tp + o_tj) * H + i_h).to(tl.int64) * K + o_k, mask=m_k, other=0.0)
        # j as the key of rows i >= j: dq_i += (do_i . v_j) k_j exp(G_i - G_j)
        b_dAc = tl.sum(b_do.to(tl.float32) * b_vj[None, :], axis=1)  # [BC]
        b_dec = tl.exp(tl.where((o_c >= j)[:, None], b_g - b_gj[None, :], float("-inf")))
        b_dq += b_dAc[:, None] * b_kj[None, :] * b_dec
        # j as the query of rows i <= j: dk_i += (do_j . v_i) q_j exp(G_j - G_i)
        b_dAr = tl.sum(b_v.to(tl.float32) * b_doj[None, :], axis=1)  # [BC]
        b_dec = tl.exp(tl.where((o_c <= j)[:, None], b_gj[None, :] - b_g, float("-inf")))
        b_dk += b_dAr[:, None] * b_qj[None, :] * b_dec * scale
    b_dq *= scale
    tl.store(dq + o_ri[:, None] * K + o_k[None, :], b_dq.to(dq.dtype.element_ty), mask=m_tik)
    tl.store(dk + o_ri[:, None] * K + o_k[None, :], b_dk.to(dk.dtype.element_ty), mask=m_tik)
    # dL/dG of these rows; rows past T are zero
    tl.store(dg + o_ri[:, None] * K + o_k[None, :], b_q * b_dq - b_k * b_dk, mask=m_tik)


@triton.jit
def _add_channel_dg_kernel(dg, hs, dhs, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Per-channel gates, in place: dg_u = sum_{i >= u in the chunk} dG_i + rowsum(h_{c+1} dh_{c+1})."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    m_tk = (o_t < T)[:, None] & (o_k < K)[None, :]
    # the state leaving the chunk depends on all of its decays: rowsum(h_{c+1} * dh_{c+1})
    b_last = tl.zeros([BK], dtype=tl.float32)
    p_h = hs + (i_bh.to(tl.int64) * (NT + 1) + i_t + 1) * K * V
    p_dh = dhs + (i_bh.to(tl.int64) * NT + i_t) * K * V
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
        b_h = tl.load(p_h + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0).to(tl.float32)
        b_dh = tl.load(p_dh + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0).to(tl.float32)
        b_last += tl.sum(b_h * b_dh, axis=1)
    p_dg = dg + ((i_b * T + o_t) * H + i_h).to(tl.int64)[:, None] * K + o_k[None, :]
    b_dG = tl.load(p_dg, mask=m_tk, other=0.0)  # [BT, BK]
    b_dg = tl.sum(b_dG, axis=0)[None, :] - tl.cumsum(b_dG, axis=0) + b_dG + b_last[None, :]
    tl.store(p_dg, b_dg, mask=m_tk)


# Block sizes and warps. The chunk length BT is the caller's chunk_size (64 on the GPU;
# the CPU tests use 16 or 32). Key and value blocks of 64 keep the [BT, BT] score
# matrix, two [BT, 64] operands and a [64, 64] state tile in registers at 4 warps.
# Alternatives timed on an H200 at (8, 4096, 16, 64) in bf16 (8 warps with state value
# blocks of 32; 2 or 8 warps in the sub-chunk kernels) were not faster beyond run-to-run spread.
_ADD_BK, _ADD_BV = 64, 64
_ADD_WARPS = 4  # warps per program of the full-chunk kernels
_ADD_CHANNEL_WARPS = 4  # warps per program of the sub-chunk kernels (per-channel gates)
_ADD_STATE_BV = 64  # value block of the two sequential state kernels (smaller: more programs)


def _add_blocks(K, V):
    """Key and value block widths for the full-chunk kernels."""
    return min(_pow2(K), _ADD_BK), min(_pow2(V), _ADD_BV)


def _add_gate_kind(g, q):
    """Classify the log decay g by shape: 0 none, 1 [H], 2 [B,T,H], 3 [B,T,H,Dk]."""
    if g is None:
        return 0
    B, T, H, K = q.shape
    kinds = {(H,): 1, (B, T, H): 2, (B, T, H, K): 3}
    assert tuple(g.shape) in kinds, f"g {tuple(g.shape)}: expected None, [H], [B,T,H] or [B,T,H,Dk]"
    return kinds[tuple(g.shape)]


def _add_forward_states(k, v, gk, h0, gate, BT):
    """Run the state kernel: hs [B,H,NT+1,K,V] (inputs' dtype) and the fp32 final state."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, BT)
    BK, BV = _add_blocks(K, V)
    BV = min(BV, _ADD_STATE_BV)
    hs = torch.empty(B, H, NT + 1, K, V, device=k.device, dtype=k.dtype)
    ht = torch.empty(B, H, K, V, device=k.device, dtype=torch.float32)
    grid = (triton.cdiv(K, BK), triton.cdiv(V, BV), B * H)
    _add_fwd_state_kernel[grid](k, v, gk, h0 if h0 is not None else ht, hs, ht, T, NT * BT, NT,
                                H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, GATE=gate,
                                HAS_H0=h0 is not None, num_warps=_ADD_WARPS)
    return hs, ht


def _add_chunk_cumsum(g, BT):
    """Per-channel gates: chunk-local cumulative sums [B, NT*BT, H, K] in fp32."""
    B, T, H, K = g.shape
    NT = triton.cdiv(T, BT)
    gc = torch.empty(B, NT * BT, H, K, device=g.device, dtype=torch.float32)
    BK = min(_pow2(K), 64)
    _add_chunk_cumsum_kernel[(triton.cdiv(K, BK), NT, B * H)](g, gc, T, NT * BT, H=H, K=K, BT=BT, BK=BK)
    return gc


class _AddChunkFunction(torch.autograd.Function):
    """Autograd wrapper: forward = states + outputs; backward recomputes the states."""

    @staticmethod
    def forward(ctx, q, k, v, g, h0, scale, BT):
        B, T, H, K = q.shape
        V = v.shape[-1]
        gate = _add_gate_kind(g, q)
        NT = triton.cdiv(T, BT)
        # the gate as the kernels read it: fp32; per-channel gates as chunk cumsums
        gk = q if gate == 0 else g.float().contiguous()
        if gate == 3:
            assert BT % _ADD_BC == 0, f"per-channel gates need chunk_size a multiple of {_ADD_BC}"
            gk = _add_chunk_cumsum(gk, BT)
        hs, ht = _add_forward_states(k, v, gk, h0, gate, BT)
        o = torch.empty_like(v)
        if gate == 3:
            BK, BV = _pow2(K), min(_pow2(V), _ADD_BV)
            _add_fwd_out_channel_kernel[(triton.cdiv(V, BV), NT * (BT // _ADD_BC), B * H)](
                q, k, v, gk, hs, o, scale, T, NT * BT, NT, H=H, K=K, V=V, BT=BT, BC=_ADD_BC,
                BK=BK, BV=BV, num_warps=_ADD_CHANNEL_WARPS)
        else:
            BK, BV = _add_blocks(K, V)
            _add_fwd_out_kernel[(triton.cdiv(V, BV), NT, B * H)](
                q, k, v, gk, hs, o, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                GATE=gate, num_warps=_ADD_WARPS)
        ctx.save_for_backward(q, k, v, g, h0, gk if gate == 3 else None)
        ctx.scale, ctx.BT, ctx.gate = scale, BT, gate
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, h0, gc = ctx.saved_tensors
        scale, BT, gate = ctx.scale, ctx.BT, ctx.gate
        B, T, H, K = q.shape
        V = v.shape[-1]
        NT = triton.cdiv(T, BT)
        do = do.contiguous()
        gk = q if gate == 0 else (gc if gate == 3 else g.float().contiguous())
        # 1) states entering each chunk, recomputed
        hs, _ = _add_forward_states(k, v, gk, h0, gate, BT)
        # 2) gradients of the states leaving each chunk, last chunk first
        BK, BV = _add_blocks(K, V)
        NK = triton.cdiv(K, BK)
        dhs = torch.empty(B, H, NT, K, V, device=q.device, dtype=q.dtype)
        dh0 = torch.empty(B, H, K, V, device=q.device, dtype=torch.float32) if h0 is not None else None
        BVs = min(BV, _ADD_STATE_BV)
        _add_bwd_state_kernel[(NK, triton.cdiv(V, BVs), B * H)](
            q, gk, do, dht.contiguous() if dht is not None else do, dhs, dh0 if dh0 is not None else do,
            scale, T, NT * BT, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BVs, GATE=gate,
            HAS_DHT=dht is not None, HAS_H0=h0 is not None, num_warps=_ADD_WARPS)
        # 3) dv, then dq, dk and the gate's gradient, one chunk per program
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if gate == 3:
            BKc, BVc = _pow2(K), min(_pow2(V), _ADD_BV)
            _add_bwd_dv_channel_kernel[(triton.cdiv(V, BVc), NT * (BT // _ADD_BC), B * H)](
                q, k, gk, do, dhs, dv, scale, T, NT * BT, NT, H=H, K=K, V=V, BT=BT, BC=_ADD_BC,
                BK=BKc, BV=BVc, num_warps=_ADD_CHANNEL_WARPS)
            dgc = torch.empty(B, T, H, K, device=q.device, dtype=torch.float32)
            _add_bwd_dqk_channel_kernel[(NK, NT * (BT // _ADD_BC), B * H)](
                q, k, v, gk, do, hs, dhs, dq, dk, dgc, scale, T, NT * BT, NT, H=H, K=K, V=V,
                BT=BT, BC=_ADD_BC, BK=BK, BV=_pow2(V), num_warps=_ADD_CHANNEL_WARPS)
            _add_channel_dg_kernel[(NK, NT, B * H)](dgc, hs, dhs, T, NT, H=H, K=K, V=V, BT=BT, BK=BK,
                                                    BV=BV, num_warps=_ADD_WARPS)
        else:
            _add_bwd_dv_kernel[(triton.cdiv(V, BV), NT, B * H)](
                q, k, gk, do, dhs, dv, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                GATE=gate, num_warps=_ADD_WARPS)
            dgc = torch.empty(NK, B, T, H, device=q.device, dtype=torch.float32) if gate else do
            _add_bwd_dqk_kernel[(NK, NT, B * H)](
                q, k, v, gk, do, hs, dhs, dq, dk, dgc, scale, T, NT, H=H, K=K, V=V,
                BT=BT, BK=BK, BV=BV, GATE=gate, num_warps=_ADD_WARPS)
            if gate:
                dgc = dgc.sum(0)  # [B, T, H]: add the key blocks' shares
        dg = None
        if gate == 1:
            dg = dgc.sum((0, 1)).to(g.dtype)  # one decay per head, used at every position
        elif gate > 1:
            dg = dgc.to(g.dtype)
        return dq, dk, dv, dg, dh0, None, None


def chunk_decay_additive(q, k, v, g=None, initial_state=None, scale=None, chunk_size=64):
    """Chunked decayed-additive recurrence on Triton kernels, differentiable.

    S_t = exp(g_t) * S_{t-1} + k_t v_t^T ;  o_t = S_t^T (scale * q_t)
    q, k [B,T,H,Dk]; v [B,T,H,Dv]; g: None, [H], [B,T,H] or [B,T,H,Dk] log decays (<= 0);
    initial_state [B,H,Dk,Dv] or None. Returns o [B,T,H,Dv] (v's dtype) and the final
    state [B,H,Dk,Dv] in fp32. Per-channel gates need Dk <= 256 (one key block).
    """
    _check_qkv(q, k, v)
    assert chunk_size >= 16 and chunk_size & (chunk_size - 1) == 0, "chunk_size: a power of two >= 16"
    if g is not None and g.dim() == 4:
        assert q.shape[-1] <= 256, "per-channel gates: Dk <= 256"
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    dt = v.dtype
    q, k = q.to(dt).contiguous(), k.to(dt).contiguous()
    v = v.contiguous()
    if initial_state is not None:
        initial_state = initial_state.float().contiguous()
    return _AddChunkFunction.apply(q, k, v, g, initial_state, scale, chunk_size)
