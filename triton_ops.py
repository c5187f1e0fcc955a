"""
Chunked Triton kernels for the linear recurrences of mixers.py, forward and backward: the
"triton" backend of its layers (its other two: "naive", the textbook loops, and "torch").

Each public function has the signature and the semantics of its chunked PyTorch twin in
mixers.py (marked @triton_twin there, which calls this one for backend="triton"), works on
q, k [B, T, H, Dk], v [B, T, H, Dv] and states [B, H, Dk, Dv] (fp32), returns (output,
final_state), accepts any T (not only chunk multiples) and has hand-written backward kernels.

    chunk_decay_additive   S_t = exp(g_t) * S_{t-1} + k_t v_t^T ;  o_t = S_t^T (scale q_t)
                           (linear attention, RetNet, mLSTM, GLA)
    chunk_delta_rule       S_t = exp(g_t) * S_{t-1} ; S_t += beta_t k_t (v_t - S_t^T k_t)^T
                           (DeltaNet, Gated DeltaNet, KDA)

Two more public functions decode one token (T = 1) in one fused kernel each, for inference
under torch.no_grad() only (no backward), with the signatures of mixers.py's decoding steps:

    recurrent_step_decay_additive   one token of chunk_decay_additive's recurrence
    recurrent_step_delta_rule       one token of chunk_delta_rule's recurrence

The kernels run compiled on a GPU and, with TRITON_INTERPRET=1, on the CPU, which is how
the tests check them against the token-by-token references of mixers.py, in fp32: the
interpreter's tl.dot multiplies bf16 operands as raw bit patterns (triton issue #11584,
unsupported there), so bf16 is checked on a GPU only.

Custom operators. Every launch runs inside a torch custom operator (torch.library.custom_op,
namespace "linearize", registered for every device), so that torch.compile(fullgraph=True)
traces the public functions without a graph break and keeps the kernels opaque. A forward
operator has a fake implementation (output shapes and dtypes, for tracing) and is tied to its
backward operator by register_autograd; the decoding steps have no autograd. An operator may
return neither None nor one of its inputs: an output it does not have comes back as an empty
tensor that the Python around it maps to None. Scalars (scale, eps, weights) are Python floats.

    linearize::add_chunk_fwd, add_chunk_bwd              chunk_decay_additive
    linearize::delta_rule_fwd, delta_rule_bwd            chunk_delta_rule
    linearize::recurrent_step_decay_additive             recurrent_step_decay_additive
    linearize::recurrent_step_delta_rule                 recurrent_step_delta_rule
    linearize::short_conv_fwd, short_conv_bwd            short_conv
    linearize::distill_loss                              distill_loss, distill_loss_grad, head_loss
    linearize::norm_fwd, norm_bwd                        rms_norm_gate, l2_normalize
    linearize::log_decay_fwd, log_decay_bwd              softplus_decay, sigmoid_decay

Naming inside kernels (the flash-linear-attention convention):
    i_  program ids and loop indices      o_  offsets (aranges)      m_  masks
    p_  pointers (tensors of addresses)   b_  block values held in registers
    B, T, H, K, V  batch, time, heads, key width Dk, value width Dv
    BT  chunk length, BC  sub-chunk length, BK / BV  key / value block widths, NT chunks
Gates, in every section: a constexpr GATE, 0 none, 1 [H] constant per head, 2 [B, T, H] per
head and token, 3 [B, T, H, K] per key channel. Tuning constants: one module-level name each,
_<SECTION>_<WHAT> (_ADD_WARPS, _DELTA_BV, _CONV_BT, ...), next to the launchers that use it.

References:
1) Yang et al., "Gated Linear Attention Transformers with Hardware-Efficient Training"
   (arXiv 2312.06635): the chunked form, the state materialised once per chunk, and the
   secondary sub-chunk level for per-channel decays.
2) flash-linear-attention (github.com/fla-org/flash-linear-attention): the kernel split
   (chunk states / outputs / state gradients / dv / dq dk dg) and the naming above.
3) Sun et al., "Retentive Network" (arXiv 2307.08621); Beck et al., "xLSTM"
   (arXiv 2405.04517): the constant and the scalar data-dependent decays.

Sections:
    1. Shared helpers (and the custom operators' namespace)
    2. Decayed-additive family: kernels, custom operators, chunk_decay_additive
    3. Delta-rule family: kernels, custom operators, chunk_delta_rule
    4. Fused one-token decoding: recurrent_step_decay_additive, recurrent_step_delta_rule
    5. Training glue, fused: in_projection (the layers' stacked projection, its rows padded for
       aligned loads; two products where a gradient is asked for, so that x's is one add),
       short_conv (mixers.short_conv from a zero past; also cutting q, k, v and L2-normalizing
       q and k), distill_loss, distill_loss_grad and head_loss (distill.py's stage-3 loss;
       head_loss applies the LM heads a slice of rows at a time), rms_norm_gate
       (the mixers' output norm and gate), l2_normalize (the delta rules' q and k without a
       conv), softplus_decay and sigmoid_decay (the log decays of Gated DeltaNet and KDA)
"""

import hashlib
from typing import Optional

import torch
import triton
import triton.language as tl

# -----------------------------------------------------------------------------
# 1. Shared helpers

_NS = "linearize"  # the namespace of every custom operator here: torch.ops.linearize.<name>

# torch.compile's caches know an operator by its name, not by its autograd: a compiled graph
# cached before an edit here would call the old backward with the old arguments. This file's
# text joins their key, so an edit compiles anew.
with open(__file__, "rb") as _f:
    _TAG = f"{_NS}-{hashlib.sha256(_f.read()).hexdigest()[:16]}"
if _TAG not in torch.compiler.config.cache_key_tag:
    torch.compiler.config.cache_key_tag += _TAG


def _op(name):
    """torch.library.custom_op under _NS that reads and writes no input in place."""
    return torch.library.custom_op(f"{_NS}::{name}", mutates_args=())


def _absent(x):
    """What an operator returns for an output it does not have: a custom operator may return
    neither None nor one of its inputs. Its callers know from their arguments (g is None, h0 is
    None, ...) which outputs are absent and map those back to None; nothing reads the values."""
    return x.new_empty(0)


def _pow2(n, lo=16):
    """Smallest power of two >= n, and at least lo (tl.dot needs every side >= 16)."""
    return max(lo, triton.next_power_of_2(n))


def _dot_precision(x):
    """tl.dot's input_precision (a constexpr DOT) for inputs like x: fp32 inputs get exact fp32
    products (slow; for checking against references), anything else Triton's default, where
    fp32 operands go through tf32."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


SPAN_MAX = 80.0  # nats: the most a bounded gate's cumsum may span inside a 16-row sub-chunk (exp overflows past ~88)


def _check_gate_min(gate_min):
    """Whether gate_min bounds the gates (None: no bound), or a one-line ValueError when the bound
    is too loose for the bounded paths of sections 2 and 3 (15 steps of it must stay within
    SPAN_MAX nats) or not a log decay."""
    if gate_min is None:
        return False
    if not -SPAN_MAX / 15 <= float(gate_min) <= 0:
        raise ValueError(f"gate_min={gate_min}: expected a log decay bound in [{-SPAN_MAX / 15:.2f}, 0], "
                         f"so that 15 steps span at most {SPAN_MAX:g} nats inside fp32's exp")
    return True


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
# so no gate, however extreme, overflows (one exception, bounded gates below: <= 80).
#
# The gate g comes in four granularities, a constexpr GATE in every kernel:
#     0  none                       linear attention
#     1  [H]        constant/head   RetNet
#     2  [B, T, H]  scalar/head     mLSTM (input gate folded into k by the caller)
#     3  [B, T, H, K] per channel   GLA
# Scalar gates (1, 2) commute with the matmuls: the kernels multiply whole rows or the
# [BT, BT] score matrix after the dot. Gates per position (2, 3) reach the kernels as their
# chunk cumsums G, computed once by a parallel kernel and saved for the backward.
# Per-channel gates (3) do not commute: exp(G_i - G_j) is a different factor in every key
# channel. Those kernels split the chunk into sub-chunks of BC = 16 rows; a pair of different
# sub-chunks (I later than J) is one dot of Q_I * exp(G_I - G_r) with K_J * exp(G_r - G_J),
# where r is the first row of I (both factors <= 1). A diagonal sub-chunk (J = I) takes one
# of two paths, a constexpr BOUNDED:
#     0  any gates: summed exactly in fp32, one key row at a time (BC steps, no tensor cores)
#     1  the caller guarantees g >= gate_min with -gate_min * (BC - 1) <= SPAN_MAX: one dot of the
#        same form and r, Q_I * exp(G_I - G_r) <= 1 with K_I * exp(G_r - G_I) <= e^80 (under
#        fp32 exp's overflow at ~88), fp32 operands at input_precision DOT; the mask comes
#        after the dot, by tl.where (entries above the diagonal may be huge: never times 0),
#        and the undecayed i = j term q_i . k_i is added exactly. r must be the first row:
#        any later anchor lets gates after row i reach row i's output through rounding.
# The backward's diagonal blocks (dV, dQ, dK) take the same two paths, with the same r; the
# exact i = j term keeps q * dq - k * dk (dG) cancelling there as on path 0. fp16 inputs
# keep path 0 (their 5-bit exponent does not hold e^80).
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
def _add_scalar_gates(g, i_b, i_h, i_t, T, NT, H: tl.constexpr, BT: tl.constexpr, GATE: tl.constexpr):
    """(G [BT], G_L): cumulative log decay of one chunk for scalar gates (GATE 1 or 2), and its
    total. Rows past T count as g = 0, so G stays at G_L there.

    No scan and no reduction here: the sequential state kernels call this once a chunk, on their
    critical path. A constant decay (GATE 1, g [H]) has G in closed form, g_h * (rows so far);
    a decay per position (GATE 2) comes as its chunk cumsums [B, NT * BT, H] (_add_chunk_cumsum,
    padding rows repeating the chunk's total): two loads that do not wait on the loop.
    """
    o_i = tl.arange(0, BT)
    if GATE == 1:
        b_gh = tl.load(g + i_h).to(tl.float32)
        n = tl.minimum(T - i_t * BT, BT)  # rows of the chunk inside the sequence
        return b_gh * tl.minimum(o_i + 1, n).to(tl.float32), b_gh * n.to(tl.float32)
    p_g = g + (i_b.to(tl.int64) * NT * BT + i_t * BT) * H + i_h  # the chunk's first row
    return tl.load(p_g + o_i * H), tl.load(p_g + (BT - 1) * H)


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
            b_g, b_gl = _add_scalar_gates(g, i_b, i_h, i_t, T, NT, H, BT, GATE)  # [BT], its total
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
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
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
        b_g, _ = _add_scalar_gates(g, i_b, i_h, i_t, T, NT, H, BT, GATE)
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
                                BV: tl.constexpr, BOUNDED: tl.constexpr, DOT: tl.constexpr):
    """Outputs of one sub-chunk I of BC rows for per-channel gates (GATE 3).

    One program per (value block, chunk * sub-chunk, batch * head); BK covers all of K.
    The state term, then one dot per earlier sub-chunk J against a reference row r (first
    row of I), then the diagonal sub-chunk: BOUNDED, one more dot against r; else exactly,
    key row by key row.
    """
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
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
    if BOUNDED:
        # the diagonal sub-chunk, one fp32 dot against r: exp(G_r - G_j) <= e^80, the mask after
        # the dot (j < i), and the undecayed i = j term q_i . k_i exactly
        b_k = tl.load(k + o_rq[:, None] * K + o_k[None, :], mask=m_ti[:, None] & m_k[None, :], other=0.0)
        b_v = tl.load(v + o_rq[:, None] * V + o_v[None, :], mask=m_ti[:, None] & m_v[None, :], other=0.0)
        b_k, b_v = b_k.to(tl.float32), b_v.to(tl.float32)
        b_A = tl.dot(b_q * tl.exp(b_g - b_gr[None, :]), tl.trans(b_k * tl.exp(b_gr[None, :] - b_g)),
                     input_precision=DOT)
        b_A = tl.where(o_c[:, None] > o_c[None, :], b_A, 0.0)
        b_o += tl.dot(b_A, b_v, input_precision=DOT) + tl.sum(b_q * b_k, axis=1)[:, None] * b_v
    else:
        # the diagonal sub-chunk exactly: column j of the scores, then its rank-1 update
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
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
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
            b_g, b_gl = _add_scalar_gates(g, i_b, i_h, i_t, T, NT, H, BT, GATE)
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
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
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
        b_g, b_gl = _add_scalar_gates(g, i_b, i_h, i_t, T, NT, H, BT, GATE)
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
                        GATE: tl.constexpr, DG: tl.constexpr):
    """dQ, dK and the scalar gates' dg of one chunk (GATE 0, 1, 2), one key block.

    dg [NK, B, T, H] holds this key block's share of the gate gradient; the wrapper sums
    the NK shares (one when K fits one block). DG false: no dg (a gate that is not learned).
    """
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
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
        if DG:
            b_hn = tl.load(p_h + K * V + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
            b_dgl += tl.sum(b_hn.to(tl.float32) * b_dh.to(tl.float32), axis=1)
    m_A = o_i[:, None] >= o_i[None, :]
    if GATE > 0:
        b_g, b_gl = _add_scalar_gates(g, i_b, i_h, i_t, T, NT, H, BT, GATE)
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
    if DG:
        # dG_i = sum over channels of (q dq - k dk), then the reverse cumsum in the chunk
        b_dG = tl.sum(b_q.to(tl.float32) * b_dq - b_k.to(tl.float32) * b_dk, axis=1)  # [BT]
        b_dg = tl.sum(b_dG, axis=0) - tl.cumsum(b_dG, axis=0) + b_dG + tl.sum(b_dgl, axis=0)
        p_dg = dg + i_k.to(tl.int64) * T * tl.num_programs(2) + (i_b * T + o_t) * H + i_h
        tl.store(p_dg, b_dg, mask=m_t)


@triton.jit
def _add_bwd_dv_channel_kernel(q, k, g, do, dhs, dv, scale, T, Tp, NT,
                               H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                               BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                               BV: tl.constexpr, BOUNDED: tl.constexpr, DOT: tl.constexpr):
    """dV of one sub-chunk I of key rows for per-channel gates (GATE 3).

    One program per (value block, chunk * sub-chunk, batch * head); BK covers all of K.
    The state-gradient term, one dot per later sub-chunk J (reference row r = first row
    of J), then the diagonal: BOUNDED, one more dot against the first row of I; else exactly.
    """
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
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
    if BOUNDED:
        # the diagonal sub-chunk, one fp32 dot against the first row r of I: exp(G_r - G_i) <=
        # e^80, the mask after the dot (key i before query j), the undecayed i = j term exactly
        b_gr = tl.load(g + ((i_b * Tp + i_t * BT + i_i * BC) * H + i_h).to(tl.int64) * K + o_k,
                       mask=m_k, other=0.0)
        b_q = tl.load(q + o_rk[:, None] * K + o_k[None, :], mask=m_ti[:, None] & m_k[None, :], other=0.0)
        b_do = tl.load(do + o_rk[:, None] * V + o_v[None, :], mask=m_ti[:, None] & m_v[None, :], other=0.0)
        b_q, b_do = b_q.to(tl.float32) * scale, b_do.to(tl.float32)
        b_At = tl.dot(b_k * tl.exp(b_gr[None, :] - b_g), tl.trans(b_q * tl.exp(b_g - b_gr[None, :])),
                      input_precision=DOT)
        b_At = tl.where(o_c[:, None] < o_c[None, :], b_At, 0.0)
        b_dv += tl.dot(b_At, b_do, input_precision=DOT) + tl.sum(b_k * b_q, axis=1)[:, None] * b_do
    else:
        # the diagonal sub-chunk exactly, one query row j at a time
        for j in tl.static_range(BC):
            o_tj = i_t * BT + i_i * BC + j
            o_rq = ((i_b * T + o_tj) * H + i_h).to(tl.int64)
            b_qj = tl.load(q + o_rq * K + o_k, mask=m_k & (o_k * 0 + o_tj < T), other=0.0)
            b_qj = b_qj.to(tl.float32) * scale
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
                                BV: tl.constexpr, BOUNDED: tl.constexpr, DOT: tl.constexpr):
    """dQ, dK and dG = q dq - k dk of one sub-chunk for per-channel gates (GATE 3).

    One program per (key block, chunk * sub-chunk, batch * head); BV covers all of V
    because the scores' gradient dO V^T needs every value channel. dG (fp32) becomes dg
    in _add_channel_dg_kernel, which adds the reverse cumulative sum over the chunk.
    The diagonal sub-chunk: BOUNDED, one dot each for dq and dk against the first row of I;
    else exactly, row by row.
    """
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
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
    if BOUNDED:
        # the diagonal sub-chunk, fp32 dots against r, with M = dA masked to j < i:
        #     dq_i += exp(G_i - G_r) sum_j M_ij k_j exp(G_r - G_j),
        #     dk_j += exp(G_r - G_j) sum_i M_ij q_i exp(G_i - G_r) scale,
        # and the undecayed i = j term exactly (q dq - k dk cancels there as in the exact sums)
        b_M = tl.where(o_c[:, None] > o_c[None, :], tl.dot(b_do, tl.trans(b_v), input_precision=DOT), 0.0)
        b_dd = tl.sum(b_do.to(tl.float32) * b_v.to(tl.float32), axis=1)[:, None]  # do_i . v_i
        b_e = b_g - b_gr[None, :]  # [BC, BK], in [-80, 0]
        b_dq += tl.dot(b_M, b_k * tl.exp(-b_e), input_precision=DOT) * tl.exp(b_e) + b_dd * b_k
        b_dkr = tl.dot(tl.trans(b_M), b_q * tl.exp(b_e), input_precision=DOT)
        b_dk += (b_dkr * tl.exp(-b_e) + b_dd * b_q) * scale
    else:
        # the diagonal sub-chunk exactly, row j of the sub-chunk at a time
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
# At stage 3's (64, 512, 9, 64) on an H100 (scripts/launch_sweep.py --op=gla --kernels), 2 warps
# in the sub-chunk kernels took their three kernels from 975 to 734 us a layer, outputs identical,
# and GLA's stage-3 step from 181 to 174 ms; 8 took them to 1,865 us (results/speed/README.md).
_ADD_BK, _ADD_BV = 64, 64
_ADD_WARPS = 4  # warps per program of the full-chunk kernels
_ADD_CHANNEL_WARPS = 2  # warps per program of the sub-chunk kernels (per-channel gates)
_ADD_STATE_BV = 64  # value block of the two sequential state kernels (smaller: more programs)


def _add_blocks(K, V):
    """Key and value block widths for the full-chunk kernels."""
    return min(_pow2(K), _ADD_BK), min(_pow2(V), _ADD_BV)


def _add_gate_kind(g, q):
    """Classify the log decay g by shape: 0 none, 1 [H], 2 [B,T,H], 3 [B,T,H,Dk]."""
    if g is None:
        return 0
    B, T, H, K = q.shape
    # by rank, then the sizes compared (not hashed: under torch.compile, sizes may be symbolic)
    kind = {1: 1, 3: 2, 4: 3}.get(g.dim(), 0)
    assert kind and tuple(g.shape) == ((H,), (B, T, H), (B, T, H, K))[kind - 1], \
        f"g {tuple(g.shape)}: expected None, [H], [B,T,H] or [B,T,H,Dk]"
    return kind


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
    """Chunk-local cumulative sums in fp32 of a gate per position: [B, NT*BT, H, K] per channel,
    [B, NT*BT, H] per head."""
    if g.dim() == 3:
        return _add_chunk_cumsum(g.unsqueeze(-1), BT).squeeze(-1)
    B, T, H, K = g.shape
    NT = triton.cdiv(T, BT)
    gc = torch.empty(B, NT * BT, H, K, device=g.device, dtype=torch.float32)
    BK = min(_pow2(K), _ADD_BK)
    _add_chunk_cumsum_kernel[(triton.cdiv(K, BK), NT, B * H)](g, gc, T, NT * BT, H=H, K=K, BT=BT, BK=BK)
    return gc


@_op("add_chunk_fwd")
def _add_chunk_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                   h0: Optional[torch.Tensor], scale: float, BT: int, bounded: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """States + outputs: (o, final state fp32, gc, hs), gc the per-channel gates' chunk cumsums
    or absent, and hs the states entering each chunk, both kept for the backward (which reads hs
    rather than running the state kernel again). bounded: per-channel gates take the bounded
    path, every g >= a gate_min that chunk_decay_additive checked."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    gate = _add_gate_kind(g, q)
    NT = triton.cdiv(T, BT)
    # the gate as the kernels read it: fp32; a gate per position as its chunk cumsums
    gk = q if gate == 0 else g.float().contiguous()  # GATE 0: q a placeholder pointer, never read
    if gate >= 2:
        gk = _add_chunk_cumsum(gk, BT)
    hs, ht = _add_forward_states(k, v, gk, h0, gate, BT)
    o = torch.empty_like(v)
    if gate == 3:
        BK, BV = _pow2(K), min(_pow2(V), _ADD_BV)
        _add_fwd_out_channel_kernel[(triton.cdiv(V, BV), NT * (BT // _ADD_BC), B * H)](
            q, k, v, gk, hs, o, scale, T, NT * BT, NT, H=H, K=K, V=V, BT=BT, BC=_ADD_BC,
            BK=BK, BV=BV, BOUNDED=bounded, DOT=_dot_precision(q),
            num_warps=_ADD_CHANNEL_WARPS)
    else:
        BK, BV = _add_blocks(K, V)
        _add_fwd_out_kernel[(triton.cdiv(V, BV), NT, B * H)](
            q, k, v, gk, hs, o, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
            GATE=gate, num_warps=_ADD_WARPS)
    return o, ht, gk if gate >= 2 else _absent(q), hs


@_add_chunk_fwd.register_fake
def _(q, k, v, g, h0, scale, BT, bounded):
    B, T, H, K = q.shape
    Tp = triton.cdiv(T, BT) * BT
    gc = _absent(q) if g is None or g.dim() == 1 else q.new_empty((B, Tp, H, K)[:g.dim()], dtype=torch.float32)
    hs = k.new_empty(B, H, Tp // BT + 1, K, v.shape[-1])
    return torch.empty_like(v), q.new_empty(B, H, K, v.shape[-1], dtype=torch.float32), gc, hs


@_op("add_chunk_bwd")
def _add_chunk_bwd(do: torch.Tensor, dht: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, g: Optional[torch.Tensor], h0: Optional[torch.Tensor], gc: torch.Tensor,
                   hs: torch.Tensor, scale: float, BT: int, bounded: bool, need_dg: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg, dh0) from the output's and the final state's gradients (dht None: none);
    dg absent without a gate or when not needed (a scalar gate then skips its work, RetNet's fixed
    decay), dh0 without an initial state. hs: the forward's states entering each chunk."""
    gate = _add_gate_kind(g, q)
    need_dg = need_dg and gate > 0
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, BT)
    do = do.contiguous()
    gk = q if gate == 0 else (gc if gate >= 2 else g.float().contiguous())
    # 1) the states entering each chunk: hs, from the forward
    # 2) gradients of the states leaving each chunk, last chunk first
    BK, BV = _add_blocks(K, V)
    NK = triton.cdiv(K, BK)
    dhs = torch.empty(B, H, NT, K, V, device=q.device, dtype=q.dtype)
    dh0 = torch.empty(B, H, K, V, device=q.device, dtype=torch.float32) if h0 is not None else None
    BVs = min(BV, _ADD_STATE_BV)
    # do stands in as the pointer of an absent dht or dh0 (HAS_DHT, HAS_H0 false: never touched)
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
            BK=BKc, BV=BVc, BOUNDED=bounded, DOT=_dot_precision(q), num_warps=_ADD_CHANNEL_WARPS)
        dgc = torch.empty(B, T, H, K, device=q.device, dtype=torch.float32)
        _add_bwd_dqk_channel_kernel[(NK, NT * (BT // _ADD_BC), B * H)](
            q, k, v, gk, do, hs, dhs, dq, dk, dgc, scale, T, NT * BT, NT, H=H, K=K, V=V,
            BT=BT, BC=_ADD_BC, BK=BK, BV=_pow2(V), BOUNDED=bounded, DOT=_dot_precision(q),
            num_warps=_ADD_CHANNEL_WARPS)
        _add_channel_dg_kernel[(NK, NT, B * H)](dgc, hs, dhs, T, NT, H=H, K=K, V=V, BT=BT, BK=BK,
                                                BV=BV, num_warps=_ADD_WARPS)
    else:
        _add_bwd_dv_kernel[(triton.cdiv(V, BV), NT, B * H)](
            q, k, gk, do, dhs, dv, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
            GATE=gate, num_warps=_ADD_WARPS)
        dgc = torch.empty(NK, B, T, H, device=q.device, dtype=torch.float32) if need_dg else do  # do: placeholder
        _add_bwd_dqk_kernel[(NK, NT, B * H)](
            q, k, v, gk, do, hs, dhs, dq, dk, dgc, scale, T, NT, H=H, K=K, V=V,
            BT=BT, BK=BK, BV=BV, GATE=gate, DG=need_dg, num_warps=_ADD_WARPS)
        if need_dg:
            dgc = dgc.sum(0)  # [B, T, H]: add the key blocks' shares
    dg = _absent(q)
    if need_dg:  # gate 1: one decay per head, used at every position
        dg = (dgc.sum((0, 1)) if gate == 1 else dgc).to(g.dtype)
    return dq, dk, dv, dg, _absent(q) if dh0 is None else dh0


@_add_chunk_bwd.register_fake
def _(do, dht, q, k, v, g, h0, gc, hs, scale, BT, bounded, need_dg):
    B, T, H, K = q.shape
    dg = g.new_empty(g.shape) if g is not None and need_dg else _absent(q)
    dh0 = _absent(q) if h0 is None else q.new_empty(B, H, K, v.shape[-1], dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dg, dh0


def _add_chunk_setup(ctx, inputs, output):
    q, k, v, g, h0, scale, BT, bounded = inputs
    _, _, *kept = output  # gc, hs
    ctx.mark_non_differentiable(*kept)
    ctx.set_materialize_grads(False)  # an unused output's gradient comes as None, not a tensor of zeros
    ctx.save_for_backward(q, k, v, g, h0, *kept)
    ctx.scale, ctx.BT, ctx.bounded = scale, BT, bounded


def _add_chunk_backward(ctx, do, dht, *_):
    q, k, v, g, h0, *kept = ctx.saved_tensors
    do = torch.zeros_like(v) if do is None else do  # only the final state was used
    need_dg = g is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dg, dh0 = _add_chunk_bwd(do, dht, q, k, v, g, h0, *kept, ctx.scale, ctx.BT, ctx.bounded, need_dg)
    return dq, dk, dv, dg if need_dg else None, None if h0 is None else dh0, None, None, None


_add_chunk_fwd.register_autograd(_add_chunk_backward, setup_context=_add_chunk_setup)


def chunk_decay_additive(q, k, v, g=None, initial_state=None, scale=None, chunk_size=64, gate_min=None):
    """Chunked decayed-additive recurrence on Triton kernels, differentiable.

    S_t = exp(g_t) * S_{t-1} + k_t v_t^T ;  o_t = S_t^T (scale * q_t)
    q, k [B,T,H,Dk]; v [B,T,H,Dv]; g: None, [H], [B,T,H] or [B,T,H,Dk] log decays (<= 0);
    initial_state [B,H,Dk,Dv] or None. Returns o [B,T,H,Dv] (v's dtype) and the final
    state [B,H,Dk,Dv] in fp32. Per-channel gates need Dk <= 256 (one key block).
    gate_min: None, or a lower bound the caller guarantees for every g, with -gate_min * 15 <= 80
    (ValueError otherwise); per-channel gates then take section 2's bounded path, one dot per
    diagonal sub-chunk (not checked: a gate below gate_min may overflow there). Other gates
    ignore it.
    """
    _check_qkv(q, k, v)
    bounded = _check_gate_min(gate_min)
    assert chunk_size >= 16 and chunk_size & (chunk_size - 1) == 0, "chunk_size: a power of two >= 16"
    gate = _add_gate_kind(g, q)
    if gate == 3:
        assert q.shape[-1] <= 256, "per-channel gates: Dk <= 256"
        assert chunk_size % _ADD_BC == 0, f"per-channel gates need chunk_size a multiple of {_ADD_BC}"
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    dt = v.dtype
    q, k = q.to(dt).contiguous(), k.to(dt).contiguous()
    v = v.contiguous()
    if initial_state is not None:
        initial_state = initial_state.float().contiguous()
    # fp16 keeps the exact path: its 5-bit exponent does not hold k * exp(G_r - G_j) up to e^80
    bounded = bounded and gate == 3 and q.dtype != torch.float16
    o, ht, *_ = _add_chunk_fwd(q, k, v, g, initial_state, scale, chunk_size, bounded)
    return o, ht


# -----------------------------------------------------------------------------
# 3. Delta-rule family: chunked Triton kernels for DeltaNet, Gated DeltaNet and KDA.
#
# One recurrence, three gate granularities (per head h, state S is Dk x Dv):
#     S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T (scale q_t)
#     g = None (DeltaNet), g [B,T,H] (Gated DeltaNet), g [B,T,H,Dk] (KDA); g is a log decay <= 0.
#
# Chunked WY / UT form (chunk C = 64, positions i, j inside a chunk, G = in-chunk cumsum of g):
#     A    = strict_tril(beta_i k_i^T Diag(exp(G_i - G_j)) k_j)      T = (I + A)^-1
#     W    = T (beta * K * exp(G))        U = T (beta * V)
#     Vnew = U - W h                                           (h = state at the chunk start)
#     O    = scale (Q * exp(G)) h + P Vnew,  P = tril(scale q_i^T Diag(exp(G_i - G_j)) k_j)
#     h'   = Diag(exp(G_last)) h + (K * exp(G_last - G))^T Vnew
# Per-channel gates (KDA) turn exp(G_i - G_j) into a per-channel factor: the chunk is cut into
# 16-row sub-chunks, off-diagonal sub-blocks are products of operands rescaled against a
# reference row that lies between i and j (every exponent <= 0), and diagonal sub-blocks are
# summed exactly, one column at a time. The two kernels that work on sub-blocks (A and P, and
# the in-chunk backward) then run one program per sub-chunk's rows, four to a chunk
# (_delta_programs). With bounded gates (every g >= gate_min, -15 gate_min <= SPAN_MAX, as Kimi
# Linear's gate makes them) a diagonal sub-block is one tensor-core product too,
#     sum_d q_id k_jd exp(G_id - G_jd) = (Q * exp(G - G_f)) (K * exp(G_f - G))^T,   masked after,
# against the sub-chunk's first row f: k's factor is at most exp(-15 gate_min), inside fp32's
# range, and the anchor is no later than any row, so no later gate reaches an earlier row's sums
# through rounding (a middle-row anchor does: fla issue #1240).
#
# Backward is written by hand: it reads the forward's W, chunk states and Vnew (kept, not
# recomputed), the state gradient runs in reverse over chunks, one kernel a chunk takes every
# other gradient (per key channel all but the in-chunk pairwise terms, which the sub-chunk
# programs add), and the gate gradient is a reverse cumulative sum of dG.
#
# References: Yang et al., "Parallelizing Linear Transformers with the Delta Rule over Sequence
# Length" (arXiv 2406.06484; WY form); Yang et al., "Gated Delta Networks" (arXiv 2412.06464);
# Kimi Team, "Kimi Linear" (arXiv 2510.26692; KDA); flash-linear-attention
# (github.com/fla-org/flash-linear-attention, fla/ops/delta_rule, gated_delta_rule and kda: the
# kernel split and the sub-chunk rescaling idea).
#
# Names inside kernels: i_ program ids and loop indices, o_ offsets, m_ masks, b_ block values
# (registers), p_ pointers. GATE is the gate granularity in section 2's codes, of which the delta rule
# takes three: 0 none, 2 [B, T, H] per head and token, 3 [B, T, H, K] per key channel (a constant
# per head, code 1, comes in expanded to code 2 by chunk_delta_rule).
# Buffers that hold chunk-shaped data (gate cumsums, A, T, P and their gradients) are padded to
# Tp = NT * 64 rows, so that kernels read them without masks and the padded rows of the gate
# cumsum repeat the last real value (exponents in padded rows stay <= 0, never inf * 0).
_DELTA_BT = 64  # chunk length
_DELTA_BC = 16  # sub-chunk length (tl.dot needs >= 16; 4 sub-chunks per chunk)
# Never _DELTA_WARPS = 8 with _DELTA_BV = 32: on an H100 with triton 3.6, _delta_fwd_o_kernel then
# reads shared memory out of range or returns a wrong output (results/speed/README.md)
_DELTA_BV = 64  # widest value block (the key block always covers all of Dk <= 256)
_DELTA_WARPS = 4  # warps per program of every delta-rule kernel but those below
# where 4 warps spill registers (compiled for sm_90 in bf16, scripts/kernel_smem.py): the main
# backward with a gate or at Dk > 64. Not where nothing spilled: DeltaNet's main backward at Dk 64 took
# 1.96 ms of fwd+bwd at 4 warps and 2.19 at 8 (8 x 4096 x 16 x 64, one H200, bench.py), before its
# pairwise terms moved in (e4d732d: 248 bytes spilled at 4 warps, 32 at 8, not yet timed)
_DELTA_WIDE_WARPS = 8
# _delta_solve_kernel: 16x16 blocks, work for one warp. Its earlier form (each diagonal block's
# substitution on its own, a row taken out of the registers by a sum) spilled 2,484 bytes a thread
# there (sm_90) and was still fastest: 0.218 ms at 1 warp, 0.431 at 2, 0.722 at 4, where each
# substitution step sums across warps (8 x 4096 x 16 x 64, one H200, bench.py --profile). With the
# four substitutions side by side and rows read back from memory: 255 registers and 928 bytes
# spilled at 1 warp, none at 2 (scripts/kernel_smem.py), and 1 warp still fastest: 0.122 ms at 1,
# 0.162 at 2, 0.223 at 4 at stage 3's 64 x 512 x 9 x 64, where the earlier form took 0.344 at 1
# warp (one H100, 2026-12-05, results/speed/kernel_bench_h100_745c312.txt)
_DELTA_SOLVE_WARPS = 1
# the A/P kernel and the in-chunk backward with a decay per key channel (gate 3, KDA), one program
# a 16-row sub-chunk: at _DELTA_WARPS=2 they took 159 and 400 us against 215 and 479 at 4, while
# 2 warps made the state backward 22 times slower (stage 3's 64 x 512 x 9 x 64, one H100,
# results/speed/launch_sweep_h100_f3c24a9/sweep_kda.txt): a constant of their own, as GLA's
# sub-chunk kernels have (_ADD_CHANNEL_WARPS)
_DELTA_CHANNEL_WARPS = 2
_DELTA_MAIN_STAGES = 1  # _delta_bwd_main_kernel: its loop over value blocks is not pipelined


# ----------------------------------------------------------------------------------------
# 3.1 delta-rule helpers
# ----------------------------------------------------------------------------------------

@triton.jit
def _delta_rows(p, o_r, m_r, o_c, m_c, stride):
    # load rows o_r (time) x columns o_c (channels) of a [T, H, D] slice whose (0, h, 0) is p
    return tl.load(p + o_r[:, None] * stride + o_c[None, :], mask=m_r[:, None] & m_c[None, :], other=0.)


@triton.jit
def _delta_put(p, x, o_r, m_r, o_c, m_c, stride):
    tl.store(p + o_r[:, None] * stride + o_c[None, :], x.to(p.dtype.element_ty),
             mask=m_r[:, None] & m_c[None, :])


@triton.jit
def _delta_blk(p, s, r, BT: tl.constexpr, BC: tl.constexpr, stride):
    # sub-block (s, r) [BC, BC] of a chunk matrix [BT, BT] stored row-major with row stride `stride`
    o_c = tl.arange(0, BC)
    return tl.load(p + (s * BC + o_c)[:, None] * stride + r * BC + o_c[None, :])


@triton.jit
def _delta_put_blk(p, x, s, r, BC: tl.constexpr, stride):
    o_c = tl.arange(0, BC)
    tl.store(p + (s * BC + o_c)[:, None] * stride + r * BC + o_c[None, :], x.to(p.dtype.element_ty))


@triton.jit
def _delta_gate_base(gc, i_b, i_h, Tp, H: tl.constexpr, K: tl.constexpr, GATE: tl.constexpr):
    # head i_h of batch i_b in the padded gate cumsum [B, Tp, H, K] or [B, Tp, H]: row t at
    # + t * H * K per channel, + t * H per head (what _delta_gate and _delta_gate_row take)
    return gc + i_b.to(tl.int64) * Tp * H * (K if GATE == 3 else 1) + i_h * (K if GATE == 3 else 1)


@triton.jit
def _delta_chunk_base(p, i_b, i_t, i_h, Tp, H: tl.constexpr, BT: tl.constexpr):
    # chunk i_t of head i_h in a padded [B, Tp, H, BT] buffer (A, T, P, dA, dP): row r at + r * H * BT
    return p + (i_b.to(tl.int64) * Tp + i_t * BT) * H * BT + i_h * BT


@triton.jit
def _delta_gate(p_g, o_r, o_k, m_k, H: tl.constexpr, K: tl.constexpr, GATE: tl.constexpr):
    # gate cumsum rows o_r from the padded buffer: [R, BK] per channel, [R, 1] per head
    if GATE == 3:
        b_g = tl.load(p_g + o_r[:, None] * (H * K) + o_k[None, :], mask=m_k[None, :], other=0.)
    else:
        b_g = tl.load(p_g + o_r * H)[:, None]
    return b_g


@triton.jit
def _delta_gate_row(p_g, t, o_k, m_k, H: tl.constexpr, K: tl.constexpr, GATE: tl.constexpr):
    # gate cumsum of one row t: [BK] per channel, a scalar per head
    if GATE == 3:
        b_g = tl.load(p_g + t * (H * K) + o_k, mask=m_k, other=0.)
    else:
        b_g = tl.load(p_g + t * H)
    return b_g


@triton.jit
def _delta_lower16(p, s, BT: tl.constexpr, BC: tl.constexpr, stride):
    # -L for the strictly lower part L of diagonal block s: rows 0 and 1 of (I + L)^-1 - I already
    o_c = tl.arange(0, BC)
    return -tl.where(o_c[:, None] > o_c[None, :], _delta_blk(p, s, s, BT, BC, stride), 0.)


@triton.jit
def _delta_sub_row(p, s, i, b_t, BC: tl.constexpr, stride):
    # one step of forward substitution in diagonal block s: row i of (I + L)^-1 - I is
    # -L_i - sum_{j<i} L_ij (T - I)_j, its rows j < i final in b_t; L_i read back from memory
    # (a cached load, where taking it out of the registers is one more reduction across lanes)
    o_c = tl.arange(0, BC)
    b_row = -tl.load(p + (s * BC + i) * stride + s * BC + o_c, mask=o_c < i, other=0.)
    b_row += tl.sum(b_row[:, None] * b_t, 0)
    return tl.where(o_c[:, None] == i, b_row[None, :], b_t)


@triton.jit
def _delta_cumsum_kernel(x, y, T_in, T_out, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                         BK: tl.constexpr, GATE: tl.constexpr, REVERSE: tl.constexpr):
    # in-chunk cumsum of a gate (forward: g -> G) or reverse cumsum of its gradient (dG -> dg)
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    if GATE == 3:
        o_k = tl.arange(0, BK)
        m_k = o_k < K
        b_x = _delta_rows(x + (i_b.to(tl.int64) * T_in * H + i_h) * K, o_t, o_t < T_in, o_k, m_k, H * K)
        b_x = b_x.to(tl.float32)
        b_y = tl.cumsum(b_x, 0)                                           # [BT, BK]
        if REVERSE:
            b_y = tl.sum(b_x, 0)[None, :] - b_y + b_x                     # sum_{s >= t}
        _delta_put(y + (i_b.to(tl.int64) * T_out * H + i_h) * K, b_y, o_t, o_t < T_out, o_k, m_k, H * K)
    else:
        b_x = tl.load(x + i_b.to(tl.int64) * T_in * H + o_t * H + i_h, mask=o_t < T_in, other=0.)
        b_x = b_x.to(tl.float32)
        b_y = tl.cumsum(b_x, 0)                                           # [BT]
        if REVERSE:
            b_y = tl.sum(b_x, 0) - b_y + b_x
        p_y = y + i_b.to(tl.int64) * T_out * H + o_t * H + i_h
        tl.store(p_y, b_y.to(y.dtype.element_ty), mask=o_t < T_out)


# ----------------------------------------------------------------------------------------
# 3.2 delta-rule forward kernels
# ----------------------------------------------------------------------------------------

@triton.jit
def _delta_kkt_kernel(q, k, beta, gc, A, P, scale, T, Tp, H: tl.constexpr, K: tl.constexpr,
                      BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, GATE: tl.constexpr, DOT: tl.constexpr,
                      BOUNDED: tl.constexpr):
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
    # per chunk: A = strict_tril(beta_i k_i.k_j decayed), P = tril(scale q_i.k_j decayed); per key
    # channel (GATE 3), one program per 16-row sub-chunk s of a chunk: the rows of A and P in s
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    if GATE == 3:
        i_t, s = i_t // (BT // BC), i_t % (BT // BC)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    p_q = q + (i_b.to(tl.int64) * T * H + i_h) * K                     # row t at + t * H * K
    p_k = k + (i_b.to(tl.int64) * T * H + i_h) * K
    p_b = beta + i_b.to(tl.int64) * T * H + i_h                         # row t at + t * H
    p_g = _delta_gate_base(gc, i_b, i_h, Tp, H, K, GATE)
    p_A = _delta_chunk_base(A, i_b, i_t, i_h, Tp, H, BT)   # chunk row r at + r * H * BT
    p_P = _delta_chunk_base(P, i_b, i_t, i_h, Tp, H, BT)
    if GATE != 3:
        # scalar decays factor out of the dot: one [BT, BT] product per matrix
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        o_i = tl.arange(0, BT)
        b_q = _delta_rows(p_q, o_t, m_t, o_k, m_k, H * K)
        b_k = _delta_rows(p_k, o_t, m_t, o_k, m_k, H * K)
        b_b = tl.load(p_b + o_t * H, mask=m_t, other=0.).to(tl.float32)
        b_kk = tl.dot(b_k, tl.trans(b_k), input_precision=DOT)                                 # [BT, BT]
        b_qk = tl.dot(b_q, tl.trans(b_k), input_precision=DOT)                                 # [BT, BT]
        m_lo = o_i[:, None] >= o_i[None, :]
        if GATE == 2:
            b_g = tl.load(p_g + o_t * H)                                  # [BT]
            b_d = tl.exp(tl.where(m_lo, b_g[:, None] - b_g[None, :], 0.))
            b_kk = b_kk * b_d
            b_qk = b_qk * b_d
        b_a = tl.where(o_i[:, None] > o_i[None, :], b_kk * b_b[:, None], 0.)
        b_p = tl.where(m_lo, b_qk * scale, 0.)
        tl.store(p_A + o_i[:, None] * (H * BT) + o_i[None, :], b_a)
        tl.store(p_P + o_i[:, None] * (H * BT) + o_i[None, :], b_p.to(P.dtype.element_ty))
    else:
        o_c = tl.arange(0, BC)
        o_s = i_t * BT + s * BC + o_c
        m_s = o_s < T
        b_qs = _delta_rows(p_q, o_s, m_s, o_k, m_k, H * K).to(tl.float32)   # [BC, BK]
        b_ks = _delta_rows(p_k, o_s, m_s, o_k, m_k, H * K).to(tl.float32)
        b_bs = tl.load(p_b + o_s * H, mask=m_s, other=0.).to(tl.float32)
        b_gs = _delta_gate(p_g, o_s, o_k, m_k, H, K, GATE)                  # [BC, BK]
        # reference row: the first of sub-chunk s, so G_i - G_ref <= 0 and G_ref - G_j <= 0
        b_gref = _delta_gate_row(p_g, i_t * BT + s * BC, o_k, m_k, H, K, GATE)
        b_qsg = b_qs * tl.exp(b_gs - b_gref[None, :])
        b_ksg = b_ks * tl.exp(b_gs - b_gref[None, :])
        if BOUNDED:
            # bounded gates: the rows of s against every column of the chunk, one product per
            # matrix, with the same first-row anchor: k's factor exp(G_ref - G_j) is at most 1
            # for earlier columns and exp(-15 gate_min) inside s; later columns (masked after)
            # take factor 1. P's undecayed i = j entry q_i . k_i exact (as section 2 keeps it)
            o_j = tl.arange(0, BT)
            o_tj = i_t * BT + o_j
            b_kc = _delta_rows(p_k, o_tj, o_tj < T, o_k, m_k, H * K).to(tl.float32)          # [BT, BK]
            b_gc = _delta_gate(p_g, o_tj, o_k, m_k, H, K, GATE)
            b_kc = b_kc * tl.exp(tl.where((o_j < (s + 1) * BC)[:, None], b_gref[None, :] - b_gc, 0.))
            b_a = tl.dot(b_ksg, tl.trans(b_kc), input_precision=DOT)                             # [BC, BT]
            b_p = tl.dot(b_qsg, tl.trans(b_kc), input_precision=DOT)
            o_i = s * BC + o_c                                                                  # chunk rows of s
            b_a = tl.where(o_i[:, None] > o_j[None, :], b_a * b_bs[:, None], 0.)
            b_p = tl.where(o_i[:, None] > o_j[None, :], b_p, tl.sum(b_qs * b_ks, 1)[:, None])
            b_p = tl.where(o_i[:, None] >= o_j[None, :], b_p * scale, 0.)
            tl.store(p_A + o_i[:, None] * (H * BT) + o_j[None, :], b_a)
            tl.store(p_P + o_i[:, None] * (H * BT) + o_j[None, :], b_p.to(P.dtype.element_ty))
        else:
            # exact path (gates without a bound): sub-block by sub-block, the diagonal one summed
            # exactly, column by column
            for r in range(0, s):
                # off-diagonal sub-blocks: columns of an earlier sub-chunk r
                o_r = i_t * BT + r * BC + o_c
                b_kr = _delta_rows(p_k, o_r, o_r < T, o_k, m_k, H * K).to(tl.float32)
                b_krg = b_kr * tl.exp(b_gref[None, :] - _delta_gate(p_g, o_r, o_k, m_k, H, K, GATE))  # [BC, BK]
                b_a = tl.dot(b_ksg, tl.trans(b_krg), input_precision=DOT) * b_bs[:, None]
                b_p = tl.dot(b_qsg, tl.trans(b_krg), input_precision=DOT) * scale
                _delta_put_blk(p_A, b_a, s, r, BC, H * BT)
                _delta_put_blk(p_P, b_p, s, r, BC, H * BT)
            # diagonal sub-block: exact per-channel sums, one column j at a time
            b_a = tl.zeros([BC, BC], dtype=tl.float32)
            b_p = tl.zeros([BC, BC], dtype=tl.float32)
            for j in range(BC):
                t_j = i_t * BT + s * BC + j
                m_j = m_k & ((t_j + 0 * o_k) < T)    # broadcast first: scalar & block masks fail in the interpreter
                b_kj = tl.load(p_k + t_j * (H * K) + o_k, mask=m_j, other=0.).to(tl.float32)
                b_gj = _delta_gate_row(p_g, t_j, o_k, m_k, H, K, GATE)
                m_ij = o_c[:, None] >= j
                b_kje = b_kj[None, :] * tl.exp(tl.where(m_ij, b_gs - b_gj[None, :], 0.))
                b_ca = tl.sum(b_ks * b_kje, 1)                          # [BC] column j of A
                b_cp = tl.sum(b_qs * b_kje, 1)                          # [BC] column j of P
                b_a = tl.where(o_c[None, :] == j, b_ca[:, None], b_a)
                b_p = tl.where(o_c[None, :] == j, b_cp[:, None], b_p)
            b_a = tl.where(o_c[:, None] > o_c[None, :], b_a * b_bs[:, None], 0.)
            b_p = tl.where(o_c[:, None] >= o_c[None, :], b_p * scale, 0.)
            _delta_put_blk(p_A, b_a, s, s, BC, H * BT)
            _delta_put_blk(p_P, b_p, s, s, BC, H * BT)
            for r in range(s + 1, BT // BC):  # above the diagonal: zeros
                _delta_put_blk(p_A, tl.zeros([BC, BC], dtype=tl.float32), s, r, BC, H * BT)
                _delta_put_blk(p_P, tl.zeros([BC, BC], dtype=tl.float32), s, r, BC, H * BT)


@triton.jit
def _delta_solve_kernel(A, Ai, H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    # T = (I + A)^-1 for one chunk: invert the four diagonal 16x16 blocks, then merge
    # the off-diagonal blocks with T_ij = -T_ii sum_{j <= m < i} A_im T_mj
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    Tp = tl.num_programs(0) * BT
    p_A = _delta_chunk_base(A, i_b, i_t, i_h, Tp, H, BT)
    p_T = _delta_chunk_base(Ai, i_b, i_t, i_h, Tp, H, BT)
    S: tl.constexpr = H * BT
    b_t00, b_t11 = _delta_lower16(p_A, 0, BT, BC, S), _delta_lower16(p_A, 1, BT, BC, S)
    b_t22, b_t33 = _delta_lower16(p_A, 2, BT, BC, S), _delta_lower16(p_A, 3, BT, BC, S)
    for i in range(2, BC):  # the four blocks' substitutions side by side: four chains, no waits
        b_t00 = _delta_sub_row(p_A, 0, i, b_t00, BC, S)
        b_t11 = _delta_sub_row(p_A, 1, i, b_t11, BC, S)
        b_t22 = _delta_sub_row(p_A, 2, i, b_t22, BC, S)
        b_t33 = _delta_sub_row(p_A, 3, i, b_t33, BC, S)
    o_c = tl.arange(0, BC)
    b_i = (o_c[:, None] == o_c[None, :]).to(tl.float32)
    b_t00, b_t11, b_t22, b_t33 = b_t00 + b_i, b_t11 + b_i, b_t22 + b_i, b_t33 + b_i
    b_a10 = _delta_blk(p_A, 1, 0, BT, BC, S)
    b_a20 = _delta_blk(p_A, 2, 0, BT, BC, S)
    b_a21 = _delta_blk(p_A, 2, 1, BT, BC, S)
    b_a30 = _delta_blk(p_A, 3, 0, BT, BC, S)
    b_a31 = _delta_blk(p_A, 3, 1, BT, BC, S)
    b_a32 = _delta_blk(p_A, 3, 2, BT, BC, S)
    # ieee fp32: the inverse feeds every output, tf32 rounding here would be amplified
    b_t10 = -tl.dot(b_t11, tl.dot(b_a10, b_t00, input_precision="ieee"), input_precision="ieee")
    b_t21 = -tl.dot(b_t22, tl.dot(b_a21, b_t11, input_precision="ieee"), input_precision="ieee")
    b_t32 = -tl.dot(b_t33, tl.dot(b_a32, b_t22, input_precision="ieee"), input_precision="ieee")
    b_x = tl.dot(b_a20, b_t00, input_precision="ieee") + tl.dot(b_a21, b_t10, input_precision="ieee")
    b_t20 = -tl.dot(b_t22, b_x, input_precision="ieee")
    b_x = tl.dot(b_a31, b_t11, input_precision="ieee") + tl.dot(b_a32, b_t21, input_precision="ieee")
    b_t31 = -tl.dot(b_t33, b_x, input_precision="ieee")
    b_x = (tl.dot(b_a30, b_t00, input_precision="ieee") + tl.dot(b_a31, b_t10, input_precision="ieee")
           + tl.dot(b_a32, b_t20, input_precision="ieee"))
    b_t30 = -tl.dot(b_t33, b_x, input_precision="ieee")
    b_z = tl.zeros([BC, BC], dtype=tl.float32)
    _delta_put_blk(p_T, b_t00, 0, 0, BC, S)
    _delta_put_blk(p_T, b_z, 0, 1, BC, S)
    _delta_put_blk(p_T, b_z, 0, 2, BC, S)
    _delta_put_blk(p_T, b_z, 0, 3, BC, S)
    _delta_put_blk(p_T, b_t10, 1, 0, BC, S)
    _delta_put_blk(p_T, b_t11, 1, 1, BC, S)
    _delta_put_blk(p_T, b_z, 1, 2, BC, S)
    _delta_put_blk(p_T, b_z, 1, 3, BC, S)
    _delta_put_blk(p_T, b_t20, 2, 0, BC, S)
    _delta_put_blk(p_T, b_t21, 2, 1, BC, S)
    _delta_put_blk(p_T, b_t22, 2, 2, BC, S)
    _delta_put_blk(p_T, b_z, 2, 3, BC, S)
    _delta_put_blk(p_T, b_t30, 3, 0, BC, S)
    _delta_put_blk(p_T, b_t31, 3, 1, BC, S)
    _delta_put_blk(p_T, b_t32, 3, 2, BC, S)
    _delta_put_blk(p_T, b_t33, 3, 3, BC, S)


@triton.jit
def _delta_wu_kernel(k, v, beta, gc, Ai, w, u, kg, T, Tp, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, DOT: tl.constexpr):
    # W = T (beta * K * exp(G)) [BT, K],  U = T (beta * V) [BT, V]; per key channel (GATE 3) also
    # kg = K * exp(G_last - G), the keys as the chunk's end state sees them, which the forward
    # state pass would otherwise rebuild from the gates inside its loop over chunks (the gradient
    # pass loads those gates for Q anyway and rebuilds kg there: reading it was slower on an H200)
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_i = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    p_T = _delta_chunk_base(Ai, i_b, i_t, i_h, Tp, H, BT)
    dt = k.dtype.element_ty  # the products' operands in the inputs' dtype (fp32 inputs: no-op casts, ieee products)
    b_T = tl.load(p_T + o_i[:, None] * (H * BT) + o_i[None, :])                    # [BT, BT]
    b_b = tl.load(beta + i_b.to(tl.int64) * T * H + o_t * H + i_h, mask=m_t, other=0.).to(tl.float32)
    p_k = k + (i_b.to(tl.int64) * T * H + i_h) * K
    b_k = _delta_rows(p_k, o_t, m_t, o_k, m_k, H * K).to(tl.float32)
    b_kb = b_k * b_b[:, None]
    if GATE != 0:
        p_g = _delta_gate_base(gc, i_b, i_h, Tp, H, K, GATE)
        b_g = _delta_gate(p_g, o_t, o_k, m_k, H, K, GATE)                             # [BT, BK] or [BT, 1]
        if GATE == 3:
            b_gl = _delta_gate_row(p_g, i_t * BT + BT - 1, o_k, m_k, H, K, GATE)       # [BK]
            _delta_put(kg + (i_b.to(tl.int64) * T * H + i_h) * K, b_k * tl.exp(b_gl[None, :] - b_g),
                       o_t, m_t, o_k, m_k, H * K)
        b_kb = b_kb * tl.exp(b_g)
    _delta_put(w + (i_b.to(tl.int64) * T * H + i_h) * K, tl.dot(b_T, b_kb.to(dt), input_precision=DOT), o_t, m_t, o_k, m_k, H * K)
    p_v = v + (i_b.to(tl.int64) * T * H + i_h) * V
    p_u = u + (i_b.to(tl.int64) * T * H + i_h) * V
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_v = _delta_rows(p_v, o_t, m_t, o_v, m_v, H * V).to(tl.float32) * b_b[:, None]
        _delta_put(p_u, tl.dot(b_T, b_v.to(dt), input_precision=DOT), o_t, m_t, o_v, m_v, H * V)


@triton.jit
def _delta_fwd_h_kernel(k, w, u, gc, h0, h, vn, ht, T, Tp, NT, H: tl.constexpr, K: tl.constexpr,
                        V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        GATE: tl.constexpr, USE_H0: tl.constexpr, DOT: tl.constexpr):
    # the only sequential part: walk the chunks, store each chunk's start state, Vnew and the final state.
    # k: per key channel (GATE 3), the wu kernel's kg = K * exp(G_last - G)
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    p_k = k + (i_b.to(tl.int64) * T * H + i_h) * K
    p_w = w + (i_b.to(tl.int64) * T * H + i_h) * K
    p_u = u + (i_b.to(tl.int64) * T * H + i_h) * V
    p_vn = vn + (i_b.to(tl.int64) * T * H + i_h) * V
    p_g = _delta_gate_base(gc, i_b, i_h, Tp, H, K, GATE)
    b_h = tl.zeros([BK, BV], dtype=tl.float32)                                       # [K, BV] state
    if USE_H0:
        b_h += _delta_rows(h0 + i_bh.to(tl.int64) * K * V, o_k, m_k, o_v, m_v, V).to(tl.float32)
    for i_t in range(NT):
        _delta_put(h + ((i_b.to(tl.int64) * NT + i_t) * H + i_h) * K * V, b_h, o_k, m_k, o_v, m_v, V)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        b_w = _delta_rows(p_w, o_t, m_t, o_k, m_k, H * K)                          # [BT, BK]
        b_u = _delta_rows(p_u, o_t, m_t, o_v, m_v, H * V)                          # [BT, BV]
        b_vn = b_u.to(tl.float32) - tl.dot(b_w, b_h.to(b_w.dtype), input_precision=DOT)                # Vnew = U - W h
        _delta_put(p_vn, b_vn, o_t, m_t, o_v, m_v, H * V)
        b_vn = b_vn.to(b_w.dtype)                 # the state sees the same rounded Vnew as O does
        b_k = _delta_rows(p_k, o_t, m_t, o_k, m_k, H * K)
        if GATE == 2:
            b_gl = tl.load(p_g + (i_t * BT + BT - 1) * H)                           # scalar
            b_g = tl.load(p_g + o_t * H)                                            # [BT]
            b_h *= tl.exp(b_gl)
            b_k = (b_k * tl.exp(b_gl - b_g)[:, None]).to(b_w.dtype)
        elif GATE == 3:
            b_gl = _delta_gate_row(p_g, i_t * BT + BT - 1, o_k, m_k, H, K, GATE)          # [BK]
            b_h *= tl.exp(b_gl)[:, None]
            b_k = b_k.to(b_w.dtype)
        b_h += tl.dot(tl.trans(b_k), b_vn, input_precision=DOT)                                          # [BK, BT] @ [BT, BV]
    _delta_put(ht + i_bh.to(tl.int64) * K * V, b_h, o_k, m_k, o_v, m_v, V)


@triton.jit
def _delta_fwd_o_kernel(q, vn, gc, h, P, o, scale, T, Tp, NT, H: tl.constexpr, K: tl.constexpr,
                        V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        GATE: tl.constexpr, DOT: tl.constexpr):
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
    # O = scale (Q * exp(G)) h + P Vnew, chunks in parallel
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_i = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_q = _delta_rows(q + (i_b.to(tl.int64) * T * H + i_h) * K, o_t, m_t, o_k, m_k, H * K)
    if GATE != 0:
        p_g = _delta_gate_base(gc, i_b, i_h, Tp, H, K, GATE)
        b_q = (b_q * tl.exp(_delta_gate(p_g, o_t, o_k, m_k, H, K, GATE))).to(q.dtype.element_ty)
    b_h = _delta_rows(h + ((i_b.to(tl.int64) * NT + i_t) * H + i_h) * K * V, o_k, m_k, o_v, m_v, V)
    b_o = tl.dot(b_q, b_h.to(b_q.dtype), input_precision=DOT) * scale                                   # [BT, BV]
    p_P = _delta_chunk_base(P, i_b, i_t, i_h, Tp, H, BT)
    b_p = tl.load(p_P + o_i[:, None] * (H * BT) + o_i[None, :])                     # [BT, BT]
    b_vn = _delta_rows(vn + (i_b.to(tl.int64) * T * H + i_h) * V, o_t, m_t, o_v, m_v, H * V)
    b_o += tl.dot(b_p.to(b_vn.dtype), b_vn, input_precision=DOT)
    _delta_put(o + (i_b.to(tl.int64) * T * H + i_h) * V, b_o, o_t, m_t, o_v, m_v, H * V)


# ----------------------------------------------------------------------------------------
# 3.3 delta-rule backward kernels
# ----------------------------------------------------------------------------------------

@triton.jit
def _delta_bwd_dh_kernel(q, k, w, gc, P, do, dht, dh0, dh, dvn, scale, T, Tp, NT, H: tl.constexpr,
                         K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                         BV: tl.constexpr, GATE: tl.constexpr, USE_DHT: tl.constexpr,
                         STORE_DH0: tl.constexpr, DOT: tl.constexpr):
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
    # reverse walk over chunks; dh is the gradient of the state at the END of the chunk:
    #   dVnew = P^T dO + (K * exp(G_last - G)) dh
    #   dh_prev = exp(G_last) dh + scale (Q * exp(G))^T dO - W^T dVnew
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_i = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    p_q = q + (i_b.to(tl.int64) * T * H + i_h) * K
    p_k = k + (i_b.to(tl.int64) * T * H + i_h) * K
    p_w = w + (i_b.to(tl.int64) * T * H + i_h) * K
    p_do = do + (i_b.to(tl.int64) * T * H + i_h) * V
    p_dv = dvn + (i_b.to(tl.int64) * T * H + i_h) * V
    p_g = _delta_gate_base(gc, i_b, i_h, Tp, H, K, GATE)
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_dh += _delta_rows(dht + i_bh.to(tl.int64) * K * V, o_k, m_k, o_v, m_v, V).to(tl.float32)
    for i_r in range(NT):
        i_t = NT - 1 - i_r
        _delta_put(dh + ((i_b.to(tl.int64) * NT + i_t) * H + i_h) * K * V, b_dh, o_k, m_k, o_v, m_v, V)
        o_t = i_t * BT + o_i
        m_t = o_t < T
        b_do = _delta_rows(p_do, o_t, m_t, o_v, m_v, H * V)                        # [BT, BV]
        b_q = _delta_rows(p_q, o_t, m_t, o_k, m_k, H * K)
        b_k = _delta_rows(p_k, o_t, m_t, o_k, m_k, H * K)
        p_P = _delta_chunk_base(P, i_b, i_t, i_h, Tp, H, BT)
        b_p = tl.load(p_P + o_i[:, None] * (H * BT) + o_i[None, :])                 # [BT, BT]
        if GATE == 2:
            b_gl = tl.load(p_g + (i_t * BT + BT - 1) * H)
            b_g = tl.load(p_g + o_t * H)[:, None]
            b_k = (b_k * tl.exp(b_gl - b_g)).to(b_do.dtype)
            b_q = (b_q * tl.exp(b_g)).to(b_do.dtype)
        elif GATE == 3:
            b_gl = _delta_gate_row(p_g, i_t * BT + BT - 1, o_k, m_k, H, K, GATE)
            b_g = _delta_gate(p_g, o_t, o_k, m_k, H, K, GATE)
            b_k = (b_k * tl.exp(b_gl[None, :] - b_g)).to(b_do.dtype)
            b_q = (b_q * tl.exp(b_g)).to(b_do.dtype)
        b_dv = tl.dot(tl.trans(b_p).to(b_do.dtype), b_do, input_precision=DOT) + tl.dot(b_k, b_dh.to(b_do.dtype), input_precision=DOT)
        _delta_put(p_dv, b_dv, o_t, m_t, o_v, m_v, H * V)
        b_w = _delta_rows(p_w, o_t, m_t, o_k, m_k, H * K)
        if GATE == 2:
            b_dh *= tl.exp(b_gl)
        elif GATE == 3:
            b_dh *= tl.exp(b_gl)[:, None]
        b_dh += tl.dot(tl.trans(b_q), b_do, input_precision=DOT) * scale - tl.dot(tl.trans(b_w), b_dv.to(b_w.dtype), input_precision=DOT)
    if STORE_DH0:
        _delta_put(dh0 + i_bh.to(tl.int64) * K * V, b_dh, o_k, m_k, o_v, m_v, V)


@triton.jit
def _delta_bwd_main_kernel(q, k, v, beta, gc, h, dh, vn, dvn, do, Ai, dq, dk, dv, db, dG, dP, dA,
                           scale, T, Tp, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, DOT: tl.constexpr):
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
    # per chunk, all of the gradients. With a decay per key channel (GATE 3) everything except
    # the in-chunk pairwise (q_i, k_j) and (k_i, k_j) terms: those leave as dP (gradient of P)
    # and dA (gradient of A) for _delta_bwd_intra_kernel, and dq, dk, db, dG take partial sums
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_i = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    dt = q.dtype.element_ty  # every product's operands in the inputs' dtype (fp32 inputs: no-op casts, ieee products)
    p_T = _delta_chunk_base(Ai, i_b, i_t, i_h, Tp, H, BT)
    b_Tt = tl.trans(tl.load(p_T + o_i[:, None] * (H * BT) + o_i[None, :]))          # [BT, BT] T^T
    b_b = tl.load(beta + i_b.to(tl.int64) * T * H + o_t * H + i_h, mask=m_t, other=0.).to(tl.float32)
    p_h = h + ((i_b.to(tl.int64) * NT + i_t) * H + i_h) * K * V
    p_dh = dh + ((i_b.to(tl.int64) * NT + i_t) * H + i_h) * K * V
    o_bv = (i_b.to(tl.int64) * T * H + i_h) * V                                     # [T, H, V] base
    b_dqi = tl.zeros([BT, BK], dtype=tl.float32)    # dO h^T
    b_dkh = tl.zeros([BT, BK], dtype=tl.float32)    # Vnew dh^T
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)     # dW = -dVnew h^T
    b_dp = tl.zeros([BT, BT], dtype=tl.float32)     # dP = dO Vnew^T
    b_dT = tl.zeros([BT, BT], dtype=tl.float32)     # dT = dU (beta V)^T + dW (beta K e^G)^T
    b_db = tl.zeros([BT], dtype=tl.float32)
    b_dgl = tl.zeros([BK], dtype=tl.float32)        # sum_v h * dh, for the G_last gradient
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_h = _delta_rows(p_h, o_k, m_k, o_v, m_v, V)                               # [BK, BV]
        b_dh = _delta_rows(p_dh, o_k, m_k, o_v, m_v, V)
        b_vn = _delta_rows(vn + o_bv, o_t, m_t, o_v, m_v, H * V)                     # [BT, BV]
        b_dvn = _delta_rows(dvn + o_bv, o_t, m_t, o_v, m_v, H * V)
        b_do = _delta_rows(do + o_bv, o_t, m_t, o_v, m_v, H * V).to(dt)
        b_v = _delta_rows(v + o_bv, o_t, m_t, o_v, m_v, H * V).to(tl.float32)
        b_ht = tl.trans(b_h).to(dt)                                                  # [BV, BK]
        b_dqi += tl.dot(b_do, b_ht, input_precision=DOT)
        b_dkh += tl.dot(b_vn.to(dt), tl.trans(b_dh).to(dt), input_precision=DOT)
        b_dw -= tl.dot(b_dvn, b_ht, input_precision=DOT)
        b_dp += tl.dot(b_do, tl.trans(b_vn).to(dt), input_precision=DOT)
        b_dxu = tl.dot(b_Tt, b_dvn, input_precision=DOT)                                                 # dU -> d(beta V)
        _delta_put(dv + o_bv, b_dxu * b_b[:, None], o_t, m_t, o_v, m_v, H * V)
        b_db += tl.sum(b_dxu * b_v, 1)
        b_dT += tl.dot(b_dvn, tl.trans(b_v * b_b[:, None]).to(dt), input_precision=DOT)
        b_dgl += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), 1)
    o_bk = (i_b.to(tl.int64) * T * H + i_h) * K
    b_q = _delta_rows(q + o_bk, o_t, m_t, o_k, m_k, H * K).to(tl.float32)
    b_k = _delta_rows(k + o_bk, o_t, m_t, o_k, m_k, H * K).to(tl.float32)
    if GATE != 0:
        p_g = _delta_gate_base(gc, i_b, i_h, Tp, H, K, GATE)
        b_g = _delta_gate(p_g, o_t, o_k, m_k, H, K, GATE)                            # [BT, BK] or [BT, 1]
        b_gl = _delta_gate_row(p_g, i_t * BT + BT - 1, o_k, m_k, H, K, GATE)
        b_eg = tl.exp(b_g)
        if GATE == 3:
            b_egl = tl.exp(b_gl[None, :] - b_g)
        else:
            b_egl = tl.exp(b_gl - b_g)
    else:
        b_eg = tl.full([BT, 1], 1., dtype=tl.float32)
        b_egl = tl.full([BT, 1], 1., dtype=tl.float32)
    b_xw = b_k * b_b[:, None] * b_eg                                                # beta K e^G
    b_dT += tl.dot(b_dw.to(dt), tl.trans(b_xw).to(dt), input_precision=DOT)
    b_dxw = tl.dot(b_Tt, b_dw.to(dt), input_precision=DOT)                                               # dW -> d(beta K e^G)
    b_dkw = b_dxw * b_b[:, None] * b_eg
    b_dkh = b_dkh * b_egl
    b_db += tl.sum(b_dxw * b_k * b_eg, 1)
    b_dq = b_dqi * scale * b_eg
    # T = (I + A)^-1  =>  dA = -T^T dT T^T, strictly lower
    b_da = -tl.dot(tl.dot(b_Tt, b_dT.to(dt), input_precision=DOT).to(dt), b_Tt, input_precision=DOT)
    b_da = tl.where(o_i[:, None] > o_i[None, :], b_da, 0.)
    b_dp = tl.where(o_i[:, None] >= o_i[None, :], b_dp * scale, 0.)
    b_dk = b_dkw + b_dkh
    if GATE != 0:
        # dG from the terms handled here: Q e^G h, beta K e^G in W, K e^(G_last - G) in h'
        b_dg = b_q * b_dq + b_k * b_dkw - b_k * b_dkh
        # G_last enters through exp(G_last) h and exp(G_last - G): one extra term on the last row
        b_last = b_dgl * tl.exp(b_gl) + tl.sum(b_k * b_dkh, 0)                      # [BK]
        b_dg = tl.where(o_i[:, None] == BT - 1, b_dg + b_last[None, :], b_dg)
        if GATE == 2:
            b_dg = tl.sum(b_dg, 1)                                                   # [BT]
    if GATE == 3:
        p_dP = _delta_chunk_base(dP, i_b, i_t, i_h, Tp, H, BT)
        p_dA = _delta_chunk_base(dA, i_b, i_t, i_h, Tp, H, BT)
        tl.store(p_dP + o_i[:, None] * (H * BT) + o_i[None, :], b_dp)
        tl.store(p_dA + o_i[:, None] * (H * BT) + o_i[None, :], b_da)
        _delta_put(dG + (i_b.to(tl.int64) * Tp * H + i_h) * K, b_dg, o_t, o_t < Tp, o_k, m_k, H * K)
    else:
        # the pairwise terms, with D_ij = exp(G_i - G_j) for i >= j (1 without a gate), one
        # product at a time (each used up before the next: fewer registers live):
        #   dq_i += sum_j dP_ij D_ij k_j                      (P = scale q.k, scale folded into dP)
        #   dk_i += beta_i sum_j dA_ij D_ij k_j,   dbeta_i += k_i . sum_j dA_ij D_ij k_j
        #   dk_j += sum_i dP_ij D_ij q_i + sum_i beta_i dA_ij D_ij k_i
        #   dG   += q * (row terms of q) + k * (row terms of k) - k * (column terms of k)
        if GATE == 2:
            b_gt = tl.load(p_g + o_t * H)                                              # [BT]
            b_d = tl.exp(tl.where(o_i[:, None] >= o_i[None, :], b_gt[:, None] - b_gt[None, :], 0.))
            b_dp = b_dp * b_d
            b_da = b_da * b_d
        b_kd = b_k.to(dt)
        b_rp = tl.dot(b_dp.to(dt), b_kd, input_precision=DOT)                            # [BT, BK]
        b_dq += b_rp
        if GATE == 2:
            b_dg += tl.sum(b_q * b_rp, 1)
        b_ra = tl.dot(b_da.to(dt), b_kd, input_precision=DOT)
        b_dk += b_ra * b_b[:, None]
        b_ra = tl.sum(b_ra * b_k, 1)                                                     # [BT]
        b_db += b_ra
        b_cp = (tl.dot(tl.trans(b_dp).to(dt), b_q.to(dt), input_precision=DOT)
                + tl.dot(tl.trans(b_da * b_b[:, None]).to(dt), b_kd, input_precision=DOT))
        b_dk += b_cp
        if GATE == 2:
            b_dg += b_b * b_ra - tl.sum(b_k * b_cp, 1)
            tl.store(dG + i_b.to(tl.int64) * Tp * H + o_t * H + i_h, b_dg)
    _delta_put(dq + o_bk, b_dq, o_t, m_t, o_k, m_k, H * K)
    _delta_put(dk + o_bk, b_dk, o_t, m_t, o_k, m_k, H * K)
    tl.store(db + i_b.to(tl.int64) * T * H + o_t * H + i_h, b_db.to(db.dtype.element_ty), mask=m_t)


@triton.jit
def _delta_bwd_intra_kernel(q, k, beta, gc, dP, dA, dq_in, dk_in, db_in, dG, dq, dk, dbeta, T, Tp,
                            H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                            BK: tl.constexpr, DOT: tl.constexpr, BOUNDED: tl.constexpr):
    # pairwise terms inside a chunk with a decay per key channel (GATE 3; for the others
    # _delta_bwd_main_kernel adds them itself). With D_ij = exp(G_i - G_j) per channel:
    #   dq_i += sum_j dP_ij D_ij k_j                      (P = scale q.k, scale folded into dP)
    #   dk_j += sum_i dP_ij D_ij q_i + sum_i beta_i dA_ij D_ij k_i
    #   dk_i += beta_i sum_j dA_ij D_ij k_j,   dbeta_i += k_i . sum_j dA_ij D_ij k_j
    #   dG   += q * (row terms of q) + k * (row terms of k) - k * (column terms of k)
    # one program per 16-row sub-chunk s of a chunk: the terms of its rows
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_t, s = i_t // (BT // BC), i_t % (BT // BC)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_bk = (i_b.to(tl.int64) * T * H + i_h) * K
    p_b = beta + i_b.to(tl.int64) * T * H + i_h
    p_db = db_in + i_b.to(tl.int64) * T * H + i_h
    p_dbo = dbeta + i_b.to(tl.int64) * T * H + i_h
    p_dP = _delta_chunk_base(dP, i_b, i_t, i_h, Tp, H, BT)
    p_dA = _delta_chunk_base(dA, i_b, i_t, i_h, Tp, H, BT)
    p_g = _delta_gate_base(gc, i_b, i_h, Tp, H, K, 3)
    o_c = tl.arange(0, BC)
    o_s = i_t * BT + s * BC + o_c
    m_s = o_s < T
    b_qs = _delta_rows(q + o_bk, o_s, m_s, o_k, m_k, H * K).to(tl.float32)
    b_ks = _delta_rows(k + o_bk, o_s, m_s, o_k, m_k, H * K).to(tl.float32)
    b_bs = tl.load(p_b + o_s * H, mask=m_s, other=0.).to(tl.float32)
    b_gs = _delta_gate(p_g, o_s, o_k, m_k, H, K, 3)
    # references: first row of s for row-side sums, last row of s for column-side sums
    b_gf = _delta_gate_row(p_g, i_t * BT + s * BC, o_k, m_k, H, K, 3)
    b_gla = _delta_gate_row(p_g, i_t * BT + s * BC + BC - 1, o_k, m_k, H, K, 3)
    b_rp = tl.zeros([BC, BK], dtype=tl.float32)
    b_ra = tl.zeros([BC, BK], dtype=tl.float32)
    b_cp = tl.zeros([BC, BK], dtype=tl.float32)
    for r in range(0, s):
        # rows of s, columns of an earlier r: exp(G_i - G_j) = exp(G_i - G_f) exp(G_f - G_j)
        o_r = i_t * BT + r * BC + o_c
        b_kr = _delta_rows(k + o_bk, o_r, o_r < T, o_k, m_k, H * K).to(tl.float32)
        b_kr = b_kr * tl.exp(b_gf[None, :] - _delta_gate(p_g, o_r, o_k, m_k, H, K, 3))
        b_rp += tl.dot(_delta_blk(p_dP, s, r, BT, BC, H * BT), b_kr, input_precision=DOT)
        b_ra += tl.dot(_delta_blk(p_dA, s, r, BT, BC, H * BT), b_kr, input_precision=DOT)
    for r in range(s + 1, BT // BC):
        # rows of a later r, columns of s: exp(G_i - G_j) = exp(G_i - G_l) exp(G_l - G_j)
        o_r = i_t * BT + r * BC + o_c
        m_r = o_r < T
        b_e = tl.exp(_delta_gate(p_g, o_r, o_k, m_k, H, K, 3) - b_gla[None, :])
        b_qr = _delta_rows(q + o_bk, o_r, m_r, o_k, m_k, H * K).to(tl.float32) * b_e
        b_kr = _delta_rows(k + o_bk, o_r, m_r, o_k, m_k, H * K).to(tl.float32) * b_e
        b_br = tl.load(p_b + o_r * H, mask=m_r, other=0.).to(tl.float32)
        b_dpr = _delta_blk(p_dP, r, s, BT, BC, H * BT)
        b_dar = _delta_blk(p_dA, r, s, BT, BC, H * BT) * b_br[:, None]
        b_cp += tl.dot(tl.trans(b_dpr), b_qr, input_precision=DOT) + tl.dot(tl.trans(b_dar), b_kr, input_precision=DOT)
    b_cp *= tl.exp(b_gla[None, :] - b_gs)
    b_dn = tl.exp(b_gs - b_gf[None, :])                                            # [BC, BK] <= 1
    if BOUNDED:
        # diagonal sub-block, bounded gates: products against the first row of s on both
        # sides (an anchor no later than any row, so no later gate reaches an earlier
        # row's sums), the factors exp(G_f - G_j) <= exp(-15 gate_min); masked first. dP's
        # i = j entries go in exactly below, so that they cancel in dG as on the exact path
        b_dpf = _delta_blk(p_dP, s, s, BT, BC, H * BT)
        b_dps = tl.where(o_c[:, None] > o_c[None, :], b_dpf, 0.)
        b_das = tl.where(o_c[:, None] > o_c[None, :], _delta_blk(p_dA, s, s, BT, BC, H * BT), 0.)
        b_up = tl.exp(b_gf[None, :] - b_gs)                                       # [BC, BK] >= 1
        b_rp += tl.dot(b_dps, b_ks * b_up, input_precision=DOT)
        b_ra += tl.dot(b_das, b_ks * b_up, input_precision=DOT)
        b_cp += b_up * (tl.dot(tl.trans(b_dps), b_qs * b_dn, input_precision=DOT)
                        + tl.dot(tl.trans(b_das * b_bs[:, None]), b_ks * b_dn, input_precision=DOT))
    b_rp *= b_dn
    b_ra *= b_dn
    if BOUNDED:
        b_dpd = tl.sum(tl.where(o_c[:, None] == o_c[None, :], b_dpf, 0.), 1)[:, None]  # dP[i, i]
        b_rp += b_dpd * b_ks
        b_cp += b_dpd * b_qs
    else:
        # diagonal sub-block, exact: loop over the row/column j inside s
        p_cs = p_dP + (s * BC) * (H * BT) + s * BC
        p_ca = p_dA + (s * BC) * (H * BT) + s * BC
        for j in range(BC):
            t_j = i_t * BT + s * BC + j
            m_j = m_k & ((t_j + 0 * o_k) < T)        # broadcast first (see _delta_kkt_kernel)
            b_kj = tl.load(k + o_bk + t_j * (H * K) + o_k, mask=m_j, other=0.).to(tl.float32)
            b_qj = tl.load(q + o_bk + t_j * (H * K) + o_k, mask=m_j, other=0.).to(tl.float32)
            b_bj = tl.load(p_b + t_j * H, mask=t_j < T, other=0.).to(tl.float32)
            b_gj = _delta_gate_row(p_g, t_j, o_k, m_k, H, K, 3)
            # row side: i in s with i >= j
            b_er = tl.exp(tl.where(o_c[:, None] >= j, b_gs - b_gj[None, :], 0.))
            b_pcol = tl.load(p_cs + o_c * (H * BT) + j)                         # dP[i, j]
            b_acol = tl.load(p_ca + o_c * (H * BT) + j)
            b_rp += b_pcol[:, None] * b_kj[None, :] * b_er
            b_ra += b_acol[:, None] * b_kj[None, :] * b_er
            # column side: j plays the row i, columns j' in s with j' <= j
            b_ec = tl.exp(tl.where(o_c[:, None] <= j, b_gj[None, :] - b_gs, 0.))
            b_prow = tl.load(p_cs + j * (H * BT) + o_c)                         # dP[j, j']
            b_arow = tl.load(p_ca + j * (H * BT) + o_c) * b_bj
            b_cp += (b_prow[:, None] * b_qj[None, :] + b_arow[:, None] * b_kj[None, :]) * b_ec
    # the main kernel's dq, dk, dbeta of these rows plus the pairwise terms (row sums b_rp of dP,
    # b_ra of dA; column sums b_cp)
    b_dq = _delta_rows(dq_in + o_bk, o_s, m_s, o_k, m_k, H * K) + b_rp
    b_dk = _delta_rows(dk_in + o_bk, o_s, m_s, o_k, m_k, H * K) + b_cp + b_ra * b_bs[:, None]
    b_db = tl.load(p_db + o_s * H, mask=m_s, other=0.) + tl.sum(b_ra * b_ks, 1)
    _delta_put(dq + o_bk, b_dq, o_s, m_s, o_k, m_k, H * K)
    _delta_put(dk + o_bk, b_dk, o_s, m_s, o_k, m_k, H * K)
    tl.store(p_dbo + o_s * H, b_db.to(p_dbo.dtype.element_ty), mask=m_s)
    b_dg = b_qs * b_rp - b_ks * b_cp + b_ks * b_ra * b_bs[:, None]
    p_dG = dG + (i_b.to(tl.int64) * Tp * H + i_h) * K + o_s[:, None] * (H * K) + o_k[None, :]
    tl.store(p_dG, tl.load(p_dG, mask=m_k[None, :], other=0.) + b_dg, mask=m_k[None, :])


# ----------------------------------------------------------------------------------------
# 3.4 delta-rule launchers, custom operators and autograd
# ----------------------------------------------------------------------------------------

def _delta_dims(q, v):
    B, T, H, K = q.shape
    V = v.shape[-1]
    assert K <= 256, "key head dim above 256 is not supported by these kernels"
    NT = triton.cdiv(T, _DELTA_BT)
    BK = max(16, triton.next_power_of_2(K))
    BV = min(_DELTA_BV, max(16, triton.next_power_of_2(V)))
    return B, T, H, K, V, NT, NT * _DELTA_BT, BK, BV


def _delta_bv_seq(B, H, V, BV):
    # the two sequential kernels run one program per (value block, b, h): with few heads,
    # narrower value blocks keep more of the GPU's 132 multiprocessors busy
    while BV > 16 and B * H * triton.cdiv(V, BV) < 256:
        BV //= 2
    return BV


def _delta_seq_stages(q, BK):
    # the two sequential kernels prefetch the next chunks' [BT, BK] tiles (3 stages by default);
    # fp32 tiles at BK = 128 would need 240 KB of shared memory, more than the H200's 227 KB
    return 1 if q.element_size() == 4 and BK > 64 else 3


def _delta_programs(NT, gate):
    """Programs along time of the A/P kernel and the in-chunk backward: one a chunk, or per key
    channel (gate 3) one a 16-row sub-chunk, which both kernels read back from program_id(0)."""
    return NT * (_DELTA_BT // _DELTA_BC if gate == 3 else 1)


def _delta_prepare(q, k, v, beta, g, scale, gate, bounded):
    """Gate cumsum, A, P and T = (I + A)^-1: everything per chunk that does not need the state."""
    B, T, H, K, V, NT, Tp, BK, BV = _delta_dims(q, v)
    BT, BC, dot = _DELTA_BT, _DELTA_BC, _dot_precision(q)
    gc = q  # placeholder pointer when there is no gate (GATE 0 never reads it)
    if gate:
        gc = torch.empty((B, Tp, H, K) if gate == 3 else (B, Tp, H), device=q.device, dtype=torch.float32)
        _delta_cumsum_kernel[(NT, B * H)](g, gc, T, Tp, H=H, K=K, BT=BT, BK=BK, GATE=gate, REVERSE=False)
    A = torch.empty(B, Tp, H, BT, device=q.device, dtype=torch.float32)
    P = torch.empty(B, Tp, H, BT, device=q.device, dtype=q.dtype)  # only read as a dot operand
    _delta_kkt_kernel[(_delta_programs(NT, gate), B * H)](
        q, k, beta, gc, A, P, scale, T, Tp, H=H, K=K, BT=BT, BC=BC, BK=BK,
        GATE=gate, DOT=dot, BOUNDED=bounded, num_warps=_DELTA_CHANNEL_WARPS if gate == 3 else _DELTA_WARPS)
    Ai = torch.empty_like(P)  # solved in fp32, stored in the inputs' dtype: only read as a dot operand
    _delta_solve_kernel[(NT, B * H)](A, Ai, H=H, BT=BT, BC=BC, num_warps=_DELTA_SOLVE_WARPS)
    return gc, Ai, P


def _delta_states(q, k, v, beta, gc, Ai, h0, gate):
    """W, U, then the chunk recurrence: per-chunk start states h [B, NT, H, K, V] and Vnew."""
    B, T, H, K, V, NT, Tp, BK, BV = _delta_dims(q, v)
    BT, dot = _DELTA_BT, _dot_precision(q)
    w, u = torch.empty_like(k), torch.empty_like(v)
    kg = torch.empty_like(k) if gate == 3 else k
    _delta_wu_kernel[(NT, B * H)](k, v, beta, gc, Ai, w, u, kg, T, Tp, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                                  GATE=gate, DOT=dot, num_warps=_DELTA_WARPS)
    # chunk states in the inputs' dtype: every reader casts them to it for its dot anyway
    h = torch.empty(B, NT, H, K, V, device=q.device, dtype=q.dtype)
    vn = torch.empty_like(v)
    BV = _delta_bv_seq(B, H, V, BV)
    ht = torch.empty(B, H, K, V, device=q.device, dtype=torch.float32)
    _delta_fwd_h_kernel[(triton.cdiv(V, BV), B * H)](
        kg, w, u, gc, h0 if h0 is not None else q, h, vn, ht, T, Tp, NT,
        H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, GATE=gate, USE_H0=h0 is not None,
        DOT=dot, num_warps=_DELTA_WARPS, num_stages=_delta_seq_stages(q, BK))
    return w, h, vn, ht


def _delta_gate_code(g):
    """g's granularity in section 2's codes: 0 none, 2 [B, T, H], 3 [B, T, H, K]."""
    return 0 if g is None else (2 if g.dim() == 3 else 3)


@_op("delta_rule_fwd")
def _delta_rule_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                    g: Optional[torch.Tensor], h0: Optional[torch.Tensor], scale: float, bounded: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                               torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o, final state fp32, gate cumsum gc (absent without a gate), T = (I + A)^-1, P, W, the
    chunk states h, Vnew): the outputs and what the backward keeps from the forward. The backward
    reads W, h and Vnew rather than computing them again: two kernels a layer less, for 3.4 GB
    more memory in stage 3 (30 layers of 64 x 512 tokens, Dk = Dv = 64, bf16). bounded: every
    per-channel g >= a gate_min that chunk_delta_rule checked."""
    gate = _delta_gate_code(g)
    B, T, H, K, V, NT, Tp, BK, BV = _delta_dims(q, v)
    gc, Ai, P = _delta_prepare(q, k, v, beta, g, scale, gate, bounded)
    w, h, vn, ht = _delta_states(q, k, v, beta, gc, Ai, h0, gate)
    o, dot = torch.empty_like(v), _dot_precision(q)
    _delta_fwd_o_kernel[(triton.cdiv(V, BV), NT, B * H)](
        q, vn, gc, h, P, o, scale, T, Tp, NT, H=H, K=K, V=V, BT=_DELTA_BT, BK=BK, BV=BV,
        GATE=gate, DOT=dot, num_warps=_DELTA_WARPS)
    return o, ht, gc if gate else _absent(q), Ai, P, w, h, vn


@_delta_rule_fwd.register_fake
def _(q, k, v, beta, g, h0, scale, bounded):
    B, T, H, K = q.shape
    Tp, BT = triton.cdiv(T, _DELTA_BT) * _DELTA_BT, _DELTA_BT
    gate = _delta_gate_code(g)
    gc = q.new_empty((B, Tp, H, K) if gate == 3 else (B, Tp, H), dtype=torch.float32) if gate else _absent(q)
    return (torch.empty_like(v), q.new_empty(B, H, K, v.shape[-1], dtype=torch.float32), gc,
            q.new_empty(B, Tp, H, BT), q.new_empty(B, Tp, H, BT),
            torch.empty_like(k), q.new_empty(B, Tp // BT, H, K, v.shape[-1]), torch.empty_like(v))


@_op("delta_rule_bwd")
def _delta_rule_bwd(do: torch.Tensor, dht: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, beta: torch.Tensor, g: Optional[torch.Tensor], h0: Optional[torch.Tensor],
                    gc: torch.Tensor, Ai: torch.Tensor, P: torch.Tensor, w: torch.Tensor, h: torch.Tensor,
                    vn: torch.Tensor, scale: float, bounded: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dbeta, dg, dh0) from the output's and the final state's gradients (dht None:
    none); dg absent without a gate, dh0 without an initial state."""
    gate = _delta_gate_code(g)
    B, T, H, K, V, NT, Tp, BK, BV = _delta_dims(q, v)
    BT, dot = _DELTA_BT, _dot_precision(q)
    if not gate:
        gc = q  # placeholder pointer (GATE 0 never reads it)
    do = do.contiguous()
    dh = torch.empty_like(h)
    dvn = torch.empty(B, T, H, V, device=q.device, dtype=q.dtype)  # read as the main kernel's operand
    dh0 = torch.empty(B, H, K, V, device=q.device, dtype=torch.float32) if h0 is not None else None
    BVs = _delta_bv_seq(B, H, V, BV)
    # q stands in as the pointer of an absent dht or dh0 (USE_DHT, STORE_DH0 false: never touched)
    _delta_bwd_dh_kernel[(triton.cdiv(V, BVs), B * H)](
        q, k, w, gc, P, do, dht.contiguous() if dht is not None else q, dh0 if dh0 is not None else q,
        dh, dvn, scale, T, Tp, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BVs, GATE=gate,
        USE_DHT=dht is not None, STORE_DH0=h0 is not None, DOT=dot, num_warps=_DELTA_WARPS,
        num_stages=_delta_seq_stages(q, BK))
    f32 = dict(device=q.device, dtype=torch.float32)
    dq, dk, dv, dbeta = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)
    dG = torch.empty((B, Tp, H, K) if gate == 3 else (B, Tp, H), **f32) if gate else q  # q: placeholder
    dq_in, dk_in, db_in, dP, dA = dq, dk, dbeta, q, q  # the main kernel's results are the gradients
    if gate == 3:  # its partial sums, and dP and dA for the in-chunk kernel, a sub-chunk a program
        dq_in, dk_in, db_in = torch.empty(B, T, H, K, **f32), torch.empty(B, T, H, K, **f32), torch.empty(B, T, H, **f32)
        dP, dA = torch.empty(B, Tp, H, BT, **f32), torch.empty(B, Tp, H, BT, **f32)
    _delta_bwd_main_kernel[(NT, B * H)](
        q, k, v, beta, gc, h, dh, vn, dvn, do, Ai, dq_in, dk_in, dv, db_in, dG, dP, dA, scale,
        T, Tp, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, GATE=gate, DOT=dot,
        num_warps=_DELTA_WIDE_WARPS if gate or BK > 64 else _DELTA_WARPS, num_stages=_DELTA_MAIN_STAGES)
    if gate == 3:
        _delta_bwd_intra_kernel[(_delta_programs(NT, gate), B * H)](
            q, k, beta, gc, dP, dA, dq_in, dk_in, db_in, dG, dq, dk, dbeta, T, Tp, H=H, K=K, BT=BT,
            BC=_DELTA_BC, BK=BK, DOT=dot, BOUNDED=bounded, num_warps=_DELTA_CHANNEL_WARPS)
    dg = _absent(q)
    if gate:
        dg = torch.empty_like(g)
        _delta_cumsum_kernel[(NT, B * H)](dG, dg, Tp, T, H=H, K=K, BT=BT, BK=BK, GATE=gate, REVERSE=True)
    return dq, dk, dv, dbeta, dg, _absent(q) if dh0 is None else dh0


@_delta_rule_bwd.register_fake
def _(do, dht, q, k, v, beta, g, h0, gc, Ai, P, w, h, vn, scale, bounded):
    B, T, H, K = q.shape
    dg = _absent(q) if g is None else torch.empty_like(g)
    dh0 = _absent(q) if h0 is None else q.new_empty(B, H, K, v.shape[-1], dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta), dg, dh0


def _delta_rule_setup(ctx, inputs, output):
    q, k, v, beta, g, h0, scale, bounded = inputs
    _, _, *kept = output  # gc, Ai, P, W, h, Vnew
    ctx.mark_non_differentiable(*kept)
    # the gradients of outputs nobody reads (the final state in training; those kept for the
    # backward, always) come as None: materialized, they were zero-filled tensors a call
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, beta, g, h0, *kept)
    ctx.scale, ctx.bounded = scale, bounded


def _delta_rule_backward(ctx, do, dht, *_):
    q, k, v, beta, g, h0, *kept = ctx.saved_tensors
    do = torch.zeros_like(v) if do is None else do  # only the final state was used
    dq, dk, dv, dbeta, dg, dh0 = _delta_rule_bwd(do, dht, q, k, v, beta, g, h0, *kept, ctx.scale, ctx.bounded)
    return dq, dk, dv, dbeta, None if g is None else dg, None if h0 is None else dh0, None, None


_delta_rule_fwd.register_autograd(_delta_rule_backward, setup_context=_delta_rule_setup)


def chunk_delta_rule(q, k, v, beta, g=None, initial_state=None, scale=None, chunk_size=64, gate_min=None):
    """Chunked delta rule (DeltaNet / Gated DeltaNet / KDA) as Triton kernels with autograd.

    q, k [B,T,H,Dk]; v [B,T,H,Dv]; beta [B,T,H]; g None, [H], [B,T,H] or [B,T,H,Dk] log decays
    (<= 0); initial_state [B,H,Dk,Dv] or None. Returns (o [B,T,H,Dv] in v's dtype, final_state
    [B,H,Dk,Dv] fp32). chunk_size is accepted for the mixers.py signature; the kernels use 64.
    gate_min: a bound the caller guarantees, every g >= gate_min (not checked on the data: that
    would wait for the GPU); per-channel gates then take tensor cores for their diagonal blocks.
    """
    assert chunk_size == _DELTA_BT, f"the delta-rule kernels use chunks of {_DELTA_BT}, got {chunk_size}"
    bounded = _check_gate_min(gate_min) and g is not None and g.dim() == 4
    B, T, H, K = q.shape
    assert K <= 256, "key head dim above 256 is not supported by these kernels"
    scale = K ** -0.5 if scale is None else scale
    if g is not None:
        if g.dim() == 1:
            g = g.view(1, 1, H).expand(B, T, H)  # a constant per head (code 1) is a per-head gate (code 2)
        assert g.dim() in (3, 4) and tuple(g.shape) == (B, T, H, K)[:g.dim()], \
            f"g {tuple(g.shape)}: expected [B,T,H] or [B,T,H,Dk]"
        g = g.contiguous()
    h0 = initial_state.float().contiguous() if initial_state is not None else None
    o, ht, *_ = _delta_rule_fwd(q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous(), g, h0,
                                float(scale), bounded)
    return o, ht


# -----------------------------------------------------------------------------
# 4. Fused one-token decoding
#
# A decoding step reads and writes the whole fp32 state for a few flops per entry: it is
# bound by memory, so the kernel's one job is to touch each state entry once. One program
# owns (value block, batch, head); it loads its [K, BV] tile of the state and, in registers,
#     S = exp(g) * S                 rows scaled: one factor per head or one per key channel
#     u = v                          decayed additive
#     u = beta * (v - S^T k)         delta rule (column j of S^T k needs only column j of S,
#                                    so value blocks stay independent)
#     S = S + k u^T ;  o = S^T (scale q)
# then stores the tile into a new state tensor, leaving the caller's state as it was.
# Gates keep section 2's codes: 0 none, 1 [H], 2 [B, 1, H], 3 [B, 1, H, K].
# There is no backward: the steps serve decoding under torch.no_grad() (model.generate); with
# autograd on, inputs that require gradients are refused rather than silently detached.

_STEP_BV = 32  # value block: more programs (B * H * cdiv(Dv, 32)) for small decoding batches
_STEP_WARPS = 4  # warps per program


@triton.jit
def _step_kernel(q, k, v, beta, g, h0, o, ht, scale, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, DELTA: tl.constexpr,
                 HAS_H0: tl.constexpr):
    """One token of either family (DELTA selects the delta rule) for one (value block, b, h).

    q, k [B, 1, H, K], v and o [B, 1, H, V] (contiguous, so row b*H + h), states [B, H, K, V] fp32.
    """
    scale = tl.cast(scale, tl.float32)  # fp64 when torch.compile launches the kernel
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_h = i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    b_q = tl.load(q + i_bh * K + o_k, mask=m_k, other=0.0).to(tl.float32) * scale  # [BK]
    b_k = tl.load(k + i_bh * K + o_k, mask=m_k, other=0.0).to(tl.float32)  # [BK]
    b_v = tl.load(v + i_bh * V + o_v, mask=m_v, other=0.0).to(tl.float32)  # [BV]
    o_kv = i_bh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :]  # [BK, BV] state offsets
    if HAS_H0:
        b_h = tl.load(h0 + o_kv, mask=m_kv, other=0.0)  # [BK, BV] fp32
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    # decay the rows of the state (log decays <= 0, so every factor is <= 1)
    if GATE == 1:
        b_h = b_h * tl.exp(tl.load(g + i_h).to(tl.float32))
    elif GATE == 2:
        b_h = b_h * tl.exp(tl.load(g + i_bh).to(tl.float32))
    elif GATE == 3:
        b_g = tl.load(g + i_bh * K + o_k, mask=m_k, other=0.0).to(tl.float32)  # [BK]
        b_h = b_h * tl.exp(b_g)[:, None]
    if DELTA:
        # write only what the decayed memory gets wrong about k: beta (v - S^T k)
        b_beta = tl.load(beta + i_bh).to(tl.float32)
        b_v = b_beta * (b_v - tl.sum(b_h * b_k[:, None], axis=0))  # [BV]
    b_h += b_k[:, None] * b_v[None, :]  # S + k u^T
    b_o = tl.sum(b_h * b_q[:, None], axis=0)  # S^T (scale q) [BV]
    tl.store(o + i_bh * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    tl.store(ht + o_kv, b_h, mask=m_kv)


def _step_check(q, k, v, beta, g, initial_state, scale):
    """Check the shapes and the grad mode; the default scale. beta None: the decayed-additive family."""
    _check_qkv(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    assert T == 1, f"a decoding step takes one token, got T = {T}"
    assert K <= 256, "decoding steps: Dk <= 256 (one key block)"
    needs_grad = any(x is not None and x.requires_grad for x in (q, k, v, beta, g, initial_state))
    assert not (torch.is_grad_enabled() and needs_grad), \
        "the decoding steps have no backward: call them under torch.no_grad()"
    _add_gate_kind(g, q)  # T = 1: [H], [B, 1, H] or [B, 1, H, K]
    if beta is not None:
        assert tuple(beta.shape) == (B, 1, H), f"beta {tuple(beta.shape)}: expected [B, 1, H]"
    if initial_state is not None:
        shape = tuple(initial_state.shape)
        assert shape == (B, H, K, V), f"initial_state {shape}: expected [B,H,Dk,Dv] = {(B, H, K, V)}"
    return K ** -0.5 if scale is None else float(scale)


def _step_launch(q, k, v, beta, g, initial_state, scale):
    """Launch _step_kernel on checked inputs: (o [B,1,H,Dv] in v's dtype, new state fp32)."""
    B, _, H, K = q.shape
    V = v.shape[-1]
    gate = _add_gate_kind(g, q)
    if initial_state is not None:
        initial_state = initial_state.float().contiguous()  # read only: the kernel writes ht
    o = torch.empty(B, 1, H, V, device=v.device, dtype=v.dtype)
    ht = torch.empty(B, H, K, V, device=v.device, dtype=torch.float32)
    BK, BV = _pow2(K), min(_pow2(V), _STEP_BV)
    # q stands in as the pointer of an absent beta or g, ht as that of an absent initial state
    # (DELTA, GATE, HAS_H0 say which the kernel reads)
    _step_kernel[(triton.cdiv(V, BV), B * H)](
        q.contiguous(), k.contiguous(), v.contiguous(), q if beta is None else beta.contiguous(),
        q if g is None else g.contiguous(), ht if initial_state is None else initial_state, o, ht, scale,
        H=H, K=K, V=V, BK=BK, BV=BV, GATE=gate, DELTA=beta is not None, HAS_H0=initial_state is not None,
        num_warps=_STEP_WARPS)
    return o, ht


def _step_fake(q, v):
    B, _, H, K = q.shape
    V = v.shape[-1]
    return v.new_empty(B, 1, H, V), v.new_empty(B, H, K, V, dtype=torch.float32)


@_op("recurrent_step_decay_additive")
def _step_additive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                   h0: Optional[torch.Tensor], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _step_launch(q, k, v, None, g, h0, scale)


@_step_additive.register_fake
def _(q, k, v, g, h0, scale):
    return _step_fake(q, v)


@_op("recurrent_step_delta_rule")
def _step_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                g: Optional[torch.Tensor], h0: Optional[torch.Tensor], scale: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    return _step_launch(q, k, v, beta, g, h0, scale)


@_step_delta.register_fake
def _(q, k, v, beta, g, h0, scale):
    return _step_fake(q, v)


def recurrent_step_decay_additive(q, k, v, g=None, initial_state=None, scale=None):
    """One decoding token of the decayed-additive family, fused; inference only (no autograd).

    S = exp(g) * S + k v^T ;  o = S^T (scale * q)
    q, k [B,1,H,Dk]; v [B,1,H,Dv]; g None, [H], [B,1,H] or [B,1,H,Dk] log decays (<= 0);
    initial_state [B,H,Dk,Dv] or None (zeros). Returns (o [B,1,H,Dv] in v's dtype, a new
    state [B,H,Dk,Dv] in fp32); initial_state is not modified.
    """
    scale = _step_check(q, k, v, None, g, initial_state, scale)
    return _step_additive(q, k, v, g, initial_state, scale)


def recurrent_step_delta_rule(q, k, v, beta, g=None, initial_state=None, scale=None):
    """One decoding token of the delta-rule family, fused; inference only (no autograd).

    S = exp(g) * S ;  S = S + beta k (v - S^T k)^T ;  o = S^T (scale * q)
    Shapes as recurrent_step_decay_additive, with beta [B,1,H]. Returns (o, new fp32 state).
    """
    scale = _step_check(q, k, v, beta, g, initial_state, scale)
    return _step_delta(q, k, v, beta, g, initial_state, scale)


# -----------------------------------------------------------------------------
# 5. Training glue: the short convolution, the distillation loss, the norms and the decay, fused
#
# Pieces of a training step that PyTorch runs as chains of memory-bound passes, or as many
# small launches, which bound the step of a small model by the host (the norms, rms_norm_gate
# and l2_normalize, and the log decays have their own notes further down):
#
#   short_conv    y = silu(causal depthwise conv over time), the short conv in front of every
#                 mixer (mixers.short_conv). cuDNN's depthwise conv and its backward, plus the
#                 padding, transposes and SiLU around it, cost about as much as the delta rule's
#                 own kernels at (B, T) = (8, 2048). Here: one kernel reads x once and writes y;
#                 backward, one kernel recomputes the pre-activation and writes its gradient da,
#                 a second writes dx and per-block partial sums of dw from da and x (one kernel
#                 that recomputes da at each of the S shifts instead was slower: 1.27 ms against
#                 0.70 at 64 x 512 x 1728, one H100, 2026-12-05). For the
#                 layers, the same kernels read q, k, v as a slice of the stacked projection,
#                 write them as three contiguous tensors and L2-normalize q and k per head
#                 (channel blocks are whole heads), which replaces a view, three copies and two
#                 norms, forward and backward.
#   distill_loss_grad
#                 ce_weight * CE(z, y) + kl_weight * T^2 KL(softmax(t / T) || softmax(z / T))
#                 per row of logits z (student) and t (teacher), [N, V]. One program per row
#                 reads the row twice (a pass for the log-sum-exps, a pass for the loss and
#                 the gradient) and writes the gradient, known in closed form:
#                     d CE / dz = softmax(z) - onehot(y),  d T^2 KL / dz = T (softmax(z / T) - p_t)
#                 so autograd's backward is one multiply by the incoming scalar (distill_loss).


# The stacked projection's rows are padded to a multiple of ROW_ALIGN
# channels. Triton's JIT proves 16-byte rows when a row stride divides by 16, and on a GPU
# Inductor pads a compiled product's rows to 128 bytes (torch._inductor.config.
# padding_alignment_bytes) where an operator of ours must see the strides it saw in eager: a row
# stride of 16 but not 64 channels is copied back to its eager stride before every operator that
# reads a slice of the product (an H200's Gated DeltaNet layer: four copies forward, three backward).
ROW_ALIGN = 64


def in_projection(x, weight, widths):
    """x [B, T, C] times the stacked projections of a layer, weight [N, C], cut into parts
    [B, T, width] of widths (q, k, v first), as F.linear and a split, but views of products whose
    rows are padded to a multiple of ROW_ALIGN channels (zero rows of the weight): the kernels
    that read q, k, v and the gate as slices then load 16 bytes at a time, where an odd row
    stride (2,322 for Gated DeltaNet) leaves them 2-byte loads. Where a gradient is asked for,
    the first part is a product of its own and the others a second one: x's gradient is then two
    products and an add, where one product's would first gather every part's gradient into one
    wide tensor, a pass of its own (5 ms of a Gated DeltaNet stage-3 step on an H100). Without
    a gradient, one product. The values, and the weight's gradient, are F.linear's."""
    widths = list(widths)
    grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if grad and len(widths) > 1:
        first, rest = weight.split([widths[0], weight.shape[0] - widths[0]])
        return (_padded_linear(x, first, widths[:1])[0], *_padded_linear(x, rest, widths[1:]))
    return _padded_linear(x, weight, widths)


def _padded_linear(x, weight, widths):
    """F.linear(x, weight) cut into widths, the product's rows padded to ROW_ALIGN channels. The
    padding is split off rather than sliced: the gradient of one split is one cat (zeros for
    the padding), where a slice's would be a pass of its own."""
    pad = -weight.shape[0] % ROW_ALIGN
    if pad:
        weight = torch.cat([weight, weight.new_zeros(pad, weight.shape[1])])
    parts = torch.nn.functional.linear(x, weight).split(widths + [pad] * (pad > 0), -1)
    return parts[:len(widths)]


@triton.jit
def _act(b_z, ACT: tl.constexpr):
    """(act(z), act'(z)) for ACT 1 silu, 2 sigmoid."""
    sig = tl.sigmoid(b_z)
    if ACT == 1:
        return b_z * sig, sig * (1 + b_z * (1 - sig))
    return sig, sig * (1 - sig)


@triton.jit
def _conv_cols(i_d, DP, NB, E: tl.constexpr, EP: tl.constexpr, NH: tl.constexpr):
    """The channels of channel block i_d: NH heads of E channels, each padded to EP lanes, inside
    one part of DP channels (NB blocks a part), so that no block straddles two heads or two parts.
    Returns the part i_p, the channels [NH * EP] in x (o_d) and in the part (o_c), their mask."""
    i_p, i_c = i_d // NB, i_d % NB
    o_a = tl.arange(0, NH * EP)
    o_j = o_a % EP
    o_c = (i_c * NH + o_a // EP) * E + o_j
    return i_p, i_p * DP + o_c, o_c, (o_j < E) & (o_c < DP)


@triton.jit
def _conv_part(p0, p1, p2, i_p):
    """The tensor of part i_p (0, 1 or 2) of three: a choice of the whole program, so that its
    loads and stores stay contiguous."""
    return p0 if i_p == 0 else (p1 if i_p == 1 else p2)


@triton.jit
def _conv_pre(x, w, o_t, o_d, m_d, T, SX, S: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """Pre-activation a[t, d] = sum_j w[d, j] x[t - (S-1) + j, d] at rows o_t (x before 0 is 0), fp32.
    x's rows are SX elements apart (a slice of a wider projection), its channels contiguous."""
    b_a = tl.zeros([BT, BD], dtype=tl.float32)
    for j in tl.static_range(S):
        o_s = o_t - (S - 1) + j
        m = ((o_s >= 0) & (o_s < T))[:, None] & m_d[None, :]
        b_x = tl.load(x + o_s.to(tl.int64)[:, None] * SX + o_d[None, :], mask=m, other=0.0).to(tl.float32)
        b_a += b_x * tl.load(w + o_d * S + j, mask=m_d, other=0.0)[None, :]
    return b_a


@triton.jit
def _head_sum(b, BT: tl.constexpr, EP: tl.constexpr, NH: tl.constexpr):
    """The sum over each head's lanes of b [BT, NH * EP], spread back over those lanes."""
    b_s = tl.sum(tl.reshape(b, [BT, NH, EP]), axis=2)  # [BT, NH]
    return tl.reshape(tl.broadcast_to(b_s[:, :, None], [BT, NH, EP]), [BT, NH * EP])


@triton.jit
def _conv_fwd_kernel(x, w, y0, y1, y2, T, D, SB, SX, DP, NB, L2P, S: tl.constexpr, BT: tl.constexpr,
                     E: tl.constexpr, EP: tl.constexpr, NH: tl.constexpr, L2: tl.constexpr):
    """y = silu(conv) for one (time block, channel block, sequence), into the block's part
    y0, y1 or y2 [B, T, DP] (contiguous); parts below L2P then divided by their heads' norms,
    floored at 1e-12 as l2_normalize (when L2). x [B, T, D] with sequences SB and rows SX
    elements apart, channels contiguous; w [D, S] fp32."""
    i_t, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = i_t * BT + tl.arange(0, BT)
    i_p, o_d, o_c, m_d = _conv_cols(i_d, DP, NB, E, EP, NH)
    b_y, _ = _act(_conv_pre(x + i_b.to(tl.int64) * SB, w, o_t, o_d, m_d, T, SX, S, BT, NH * EP), 1)  # silu
    if L2:
        if i_p < L2P:
            b_y = b_y / tl.sqrt(_head_sum(b_y * b_y, BT, EP, NH) + 1e-24)
    y = _conv_part(y0, y1, y2, i_p)
    o_y = (i_b * T + o_t).to(tl.int64)[:, None] * DP + o_c[None, :]
    tl.store(y + o_y, b_y.to(y.dtype.element_ty), mask=(o_t < T)[:, None] & m_d[None, :])


@triton.jit
def _conv_da_kernel(x, w, dy0, dy1, dy2, da, T, D, SB, SX, DP, NB, L2P, S: tl.constexpr, BT: tl.constexpr,
                    E: tl.constexpr, EP: tl.constexpr, NH: tl.constexpr, L2: tl.constexpr):
    """The gradient at the pre-activation, da [B, T, D] contiguous, from the parts' gradients dy0,
    dy1, dy2 laid out as y, the pre-activation recomputed. Through a head's L2 norm, with
    yh = y r: dy_silu = r (dy - yh sum(dy yh)); then da = dy_silu * silu'(a)."""
    i_t, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = i_t * BT + tl.arange(0, BT)
    i_p, o_d, o_c, m_d = _conv_cols(i_d, DP, NB, E, EP, NH)
    m = (o_t < T)[:, None] & m_d[None, :]
    b_a = _conv_pre(x + i_b.to(tl.int64) * SB, w, o_t, o_d, m_d, T, SX, S, BT, NH * EP)
    dy = _conv_part(dy0, dy1, dy2, i_p)
    o_row = (i_b * T + o_t).to(tl.int64)[:, None]
    b_dy = tl.load(dy + o_row * DP + o_c[None, :], mask=m, other=0.0).to(tl.float32)
    b_y, b_ds = _act(b_a, 1)  # silu(a), silu'(a)
    if L2:
        if i_p < L2P:
            b_r = 1 / tl.sqrt(_head_sum(b_y * b_y, BT, EP, NH) + 1e-24)
            b_yh = b_y * b_r
            b_dy = b_r * (b_dy - b_yh * _head_sum(b_dy * b_yh, BT, EP, NH))
    tl.store(da + o_row * D + o_d[None, :], (b_dy * b_ds).to(da.dtype.element_ty), mask=m)


@triton.jit
def _conv_bwd_kernel(x, w, da, dx, dwp, T, D, SB, SX, DP, NB, NT, S: tl.constexpr, BT: tl.constexpr,
                     E: tl.constexpr, EP: tl.constexpr, NH: tl.constexpr):
    """dx [B, T, D] (contiguous) and this block's share of dw, dwp [B * NT, S, D] fp32 (summed
    by the caller). x at row t feeds output row t + (S-1) - j through tap j, so
    dx_t = sum_j w_j da_{t+S-1-j}; dw_j = sum_t da_t x_{t-(S-1)+j}."""
    i_t, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    x += i_b.to(tl.int64) * SB
    base = i_b.to(tl.int64) * T * D
    da, dx = da + base, dx + base
    o_t = (i_t * BT + tl.arange(0, BT)).to(tl.int64)
    _, o_d, _, m_d = _conv_cols(i_d, DP, NB, E, EP, NH)
    b_dx = tl.zeros([BT, NH * EP], dtype=tl.float32)
    p_dw = dwp + (i_b * NT + i_t).to(tl.int64) * S * D
    b_da = tl.load(da + o_t[:, None] * D + o_d[None, :], mask=(o_t < T)[:, None] & m_d[None, :], other=0.0)
    for j in tl.static_range(S):
        b_w = tl.load(w + o_d * S + j, mask=m_d, other=0.0)
        o_s = o_t + (S - 1) - j  # the output rows that read this block's x through tap j
        m_s = (o_s < T)[:, None] & m_d[None, :]
        b_dx += tl.load(da + o_s[:, None] * D + o_d[None, :], mask=m_s, other=0.0).to(tl.float32) * b_w[None, :]
        o_s = o_t - (S - 1) + j  # the x rows this block's outputs read through tap j
        m_s = ((o_s >= 0) & (o_s < T))[:, None] & m_d[None, :]
        b_x = tl.load(x + o_s.to(tl.int64)[:, None] * SX + o_d[None, :], mask=m_s, other=0.0).to(tl.float32)
        tl.store(p_dw + j * D + o_d, tl.sum(b_da.to(tl.float32) * b_x, axis=0), mask=m_d)
    tl.store(dx + o_t[:, None] * D + o_d[None, :], b_dx.to(dx.dtype.element_ty), mask=(o_t < T)[:, None] & m_d[None, :])


# Rows and warps from a sweep at stage 3's shape (64 x 512, q, k and v of 9 heads of 64, one H100,
# 2026-12-06): 32 rows on 2 warps took 101 us forward and 344 us backward, 64 rows on 4 warps 111
# and 470 (results/speed/README.md).
_CONV_BT = 32  # time rows per program
_CONV_LANES = 64  # channel lanes per program: whole heads of head_dim channels, or 64 channels
_CONV_WARPS = 2  # warps per program
_CONV_PARTS = 3  # at most: q, k, v


def _conv_blocks(DP, head_dim):
    """(E, EP, NH, NB): channel blocks of NH heads of E channels (EP lanes each), _CONV_LANES
    lanes or one head, NB of them to a part of DP channels; NH divides the part's heads, so that
    no block straddles two parts. Without heads (head_dim None) the blocks are plain
    _CONV_LANES-channel slices."""
    if head_dim is None:
        return _CONV_LANES, _CONV_LANES, 1, triton.cdiv(DP, _CONV_LANES)
    EP = triton.next_power_of_2(head_dim)
    NH = max(1, _CONV_LANES // EP)
    while (DP // head_dim) % NH:  # a power of two (the lanes) that divides the part's heads
        NH //= 2
    return head_dim, EP, NH, DP // head_dim // NH


def _conv_rows(x):
    """x [B, T, D] as the kernels read it: any strides with contiguous channels."""
    return x if x.stride(2) == 1 else x.contiguous()


def _three(ts):
    """A list of one to three tensors as the kernels' three pointers (the last repeated)."""
    return [*ts, *[ts[-1]] * (_CONV_PARTS - len(ts))]


@_op("short_conv_fwd")
def _short_conv_fwd(x: torch.Tensor, w: torch.Tensor, parts: int, l2_parts: int,
                    head_dim: Optional[int]) -> list[torch.Tensor]:
    """The parts [B, T, D / parts] of y, each contiguous in x's dtype: separate tensors, so that
    their gradients reach the backward as they are, with no stack."""
    x = _conv_rows(x)
    B, T, D = x.shape
    S, DP = w.shape[1], D // parts
    w32 = w.float().contiguous()
    E, EP, NH, NB = _conv_blocks(DP, head_dim)
    ys = [torch.empty(B, T, DP, device=x.device, dtype=x.dtype) for _ in range(parts)]
    grid = (triton.cdiv(T, _CONV_BT), parts * NB, B)
    _conv_fwd_kernel[grid](x, w32, *_three(ys), T, D, x.stride(0), x.stride(1), DP, NB, l2_parts, S=S,
                           BT=_CONV_BT, E=E, EP=EP, NH=NH, L2=l2_parts > 0, num_warps=_CONV_WARPS)
    return ys


@_short_conv_fwd.register_fake
def _(x, w, parts, l2_parts, head_dim):
    B, T, D = x.shape
    return [x.new_empty(B, T, D // parts) for _ in range(parts)]


@_op("short_conv_bwd")
def _short_conv_bwd(dys: list[torch.Tensor], x: torch.Tensor, w: torch.Tensor, l2_parts: int,
                    head_dim: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx [B, T, D] contiguous in x's dtype, dw [D, S] in w's dtype) from the parts' gradients dys,
    laid out as the parts."""
    x = _conv_rows(x)
    w32 = w.float().contiguous()
    dys = [d.contiguous() for d in dys]
    B, T, D = x.shape
    parts = len(dys)
    DP = D // parts
    E, EP, NH, NB = _conv_blocks(DP, head_dim)
    S, NT = w32.shape[1], triton.cdiv(T, _CONV_BT)
    grid = (NT, parts * NB, B)
    da = torch.empty(B, T, D, device=x.device, dtype=dys[0].dtype)
    dx = torch.empty(B, T, D, device=x.device, dtype=x.dtype)
    dwp = torch.empty(B * NT, S, D, device=x.device, dtype=torch.float32)
    SB, SX = x.stride(0), x.stride(1)
    _conv_da_kernel[grid](x, w32, *_three(dys), da, T, D, SB, SX, DP, NB, l2_parts, S=S, BT=_CONV_BT,
                          E=E, EP=EP, NH=NH, L2=l2_parts > 0, num_warps=_CONV_WARPS)
    _conv_bwd_kernel[grid](x, w32, da, dx, dwp, T, D, SB, SX, DP, NB, NT, S=S, BT=_CONV_BT, E=E, EP=EP,
                           NH=NH, num_warps=_CONV_WARPS)
    return dx, dwp.sum(0).t().contiguous().to(w.dtype)


@_short_conv_bwd.register_fake
def _(dys, x, w, l2_parts, head_dim):
    return x.new_empty(x.shape), w.new_empty(w.shape)


def _short_conv_setup(ctx, inputs, output):
    x, w, parts, l2_parts, head_dim = inputs
    ctx.save_for_backward(x, w)
    ctx.l2_parts, ctx.head_dim = l2_parts, head_dim


def _short_conv_backward(ctx, dys):
    x, w = ctx.saved_tensors
    dx, dw = _short_conv_bwd(list(dys), x, w, ctx.l2_parts, ctx.head_dim)
    return dx, dw, None, None, None


_short_conv_fwd.register_autograd(_short_conv_backward, setup_context=_short_conv_setup)


def short_conv(x, weight, parts=1, l2_parts=0, head_dim=None, tail=None):
    """silu(causal depthwise conv1d over time) from a zero past: mixers.short_conv without a tail.

    x [B, T, D] (any strides with contiguous channels: a slice of a wider projection); weight [D, S] (tap
    S-1 multiplies the current token). Returns y [B, T, D] in x's dtype; the sums run in fp32
    with the fp32 weights. With parts > 1 (at most 3), y comes cut along the channels into that
    many contiguous [B, T, D / parts] tensors (q, k, v from one projection, with no copy), and
    with l2_parts the first l2_parts of them are L2-normalized per head of head_dim channels (the
    delta rules' unit q and k). tail: None only, in the twin's signature: the kernel starts from
    a zero past, and a decoding step continues from its tail in mixers.short_conv.
    """
    assert tail is None, "the fused short conv starts from a zero past; decode with mixers.short_conv"
    assert x.dim() == 3 and weight.dim() == 2 and weight.shape[0] == x.shape[2], \
        f"x {tuple(x.shape)} must be [B,T,D] and weight {tuple(weight.shape)} [D,S]"
    assert 1 <= parts <= _CONV_PARTS and x.shape[2] % parts == 0 and l2_parts <= parts, \
        f"{x.shape[2]} channels do not cut into {parts} parts (1 to {_CONV_PARTS})"
    assert not l2_parts or (head_dim and (x.shape[2] // parts) % head_dim == 0), "L2 needs heads that tile the parts"
    # autograd hands the backward zeros for a part that got no gradient
    ys = _short_conv_fwd(x, weight, parts, l2_parts, head_dim if l2_parts else None)
    return ys[0] if parts == 1 else ys


@triton.jit
def _lse_update(m, s, b):
    """Running (max, sum of exp(. - max)) of a row after one more block b (masked entries -inf)."""
    m_new = tl.maximum(m, tl.max(b, axis=0))
    return m_new, s * tl.exp(m - m_new) + tl.sum(tl.exp(b - m_new), axis=0)


@triton.jit
def _distill_loss_kernel(z, t, y, inv_n, grad, ce, kl, V, ce_weight, kl_weight, temperature,
                         KL: tl.constexpr, GRAD: tl.constexpr, BV: tl.constexpr):
    """One row: ce[row] = lse(z) - z[y], kl[row] = T^2 sum p_t (log p_t - log softmax(z / T)),
    grad[row] = (ce_weight d ce + kl_weight d kl) * inv_n, all 0 where y < 0. inv_n: a pointer to
    1 / (rows that count), read on the device (no host sync)."""
    row = tl.program_id(0).to(tl.int64)
    z, t, grad = z + row * V, t + row * V, grad + row * V
    # float arguments arrive as fp64 when torch.compile launches the kernel: fp32 math throughout
    ce_weight, kl_weight = tl.cast(ce_weight, tl.float32), tl.cast(kl_weight, tl.float32)
    temperature = tl.cast(temperature, tl.float32)
    target = tl.load(y + row)
    keep = target >= 0
    o_v = tl.arange(0, BV)
    neg = float("-inf")
    m_z, s_z = tl.max(tl.full([BV], neg, tl.float32), axis=0), tl.sum(tl.zeros([BV], tl.float32), axis=0)
    m_zt, s_zt, m_t, s_t = m_z, s_z, m_z, s_z
    for i in range(0, V, BV):  # pass 1: the log-sum-exps
        m = i + o_v < V
        b_z = tl.load(z + i + o_v, mask=m, other=neg).to(tl.float32)
        m_z, s_z = _lse_update(m_z, s_z, b_z)
        if KL:
            m_zt, s_zt = _lse_update(m_zt, s_zt, b_z / temperature)
            m_t, s_t = _lse_update(m_t, s_t, tl.load(t + i + o_v, mask=m, other=neg).to(tl.float32) / temperature)
    lse_z = m_z + tl.log(s_z)
    if KL:
        lse_zt, lse_t = m_zt + tl.log(s_zt), m_t + tl.log(s_t)
    scale = tl.where(keep, tl.load(inv_n), 0.0)
    b_kl = tl.zeros([BV], dtype=tl.float32)
    for i in range(0, V, BV):  # pass 2: the KL sum and the gradient
        m = i + o_v < V
        b_z = tl.load(z + i + o_v, mask=m, other=0.0).to(tl.float32)
        b_g = ce_weight * tl.exp(b_z - lse_z) - tl.where(i + o_v == target, ce_weight, 0.0)
        if KL:
            b_ls = b_z / temperature - lse_zt  # log softmax(z / T)
            b_lt = tl.load(t + i + o_v, mask=m, other=0.0).to(tl.float32) / temperature - lse_t
            b_pt = tl.exp(b_lt)
            b_kl += tl.where(m, b_pt * (b_lt - b_ls), 0.0)
            b_g += kl_weight * temperature * (tl.exp(b_ls) - b_pt)
        if GRAD:
            tl.store(grad + i + o_v, (b_g * scale).to(grad.dtype.element_ty), mask=m)
    z_y = tl.load(z + tl.maximum(target, 0)).to(tl.float32)
    tl.store(ce + row, tl.where(keep, lse_z - z_y, 0.0))
    tl.store(kl + row, tl.where(keep, tl.sum(b_kl, axis=0) * temperature * temperature, 0.0))


# Block and warps from a sweep at stage 3's call (4,096 rows of 49,152 logits, one H100,
# 2026-12-06): 2,048 on 4 warps took the kernel 834 us, 4,096 on 8 warps 955 (results/speed/README.md).
_LOSS_BV = 2048  # vocabulary block: a row of V logits in cdiv(V, _LOSS_BV) steps per pass
_LOSS_WARPS = 4  # warps per program (one row)


@_op("distill_loss")
def _distill_loss_op(z: torch.Tensor, t: Optional[torch.Tensor], y: torch.Tensor, ce_weight: float,
                     kl_weight: float, temperature: float, grad: bool, inv_n: Optional[torch.Tensor] = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss = ce_weight * ce + kl_weight * kl, ce, kl, dz): fp32 scalars and the gradient of the
    loss in z's dtype, absent when grad is False. ce and kl are sums over the rows times inv_n, a
    0-d fp32 tensor: by default 1 / (rows that count), so means; another for rows that are a
    slice of a larger batch."""
    N, V = z.shape
    z, y = z.contiguous(), y.contiguous()
    if inv_n is None:
        inv_n = 1.0 / (y >= 0).sum().clamp(min=1).float()  # stays on the device
    dz = torch.empty_like(z) if grad else None
    ce, kl = (torch.empty(N, device=z.device, dtype=torch.float32) for _ in range(2))
    # z stands in as the pointer of an absent teacher or gradient (KL, GRAD false: never touched)
    _distill_loss_kernel[(N,)](z, z if t is None else t.contiguous(), y, inv_n.reshape(1), z if dz is None else dz,
                               ce, kl, V, ce_weight, kl_weight, temperature, KL=t is not None,
                               GRAD=grad, BV=min(_LOSS_BV, triton.next_power_of_2(V)), num_warps=_LOSS_WARPS)
    ce, kl = ce.sum() * inv_n, kl.sum() * inv_n
    return ce_weight * ce + kl_weight * kl, ce, kl, _absent(z) if dz is None else dz


@_distill_loss_op.register_fake
def _(z, t, y, ce_weight, kl_weight, temperature, grad, inv_n=None):
    return (*(z.new_empty((), dtype=torch.float32) for _ in range(3)), z.new_empty(z.shape) if grad else _absent(z))


def _distill_loss_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)  # no zero-filled [N, V] gradient for dz, which nobody reads
    ctx.save_for_backward(output[3])


def _distill_loss_backward(ctx, dloss, *_):
    (dz,) = ctx.saved_tensors
    # the loss is linear in dz's scale; dloss None: the loss itself was not used
    dz = dz * dloss.to(dz.dtype) if ctx.needs_input_grad[0] and dloss is not None else None
    return dz, None, None, None, None, None, None, None


_distill_loss_op.register_autograd(_distill_loss_backward, setup_context=_distill_loss_setup)


def _distill_check(z, t, y):
    assert z.dim() == 2 and y.shape == z.shape[:1], f"z {tuple(z.shape)} must be [N,V], y {tuple(y.shape)} [N]"
    assert t is None or t.shape == z.shape, f"t {tuple(t.shape)} must match z {tuple(z.shape)}"


def distill_loss_grad(z, t, y, ce_weight=1.0, kl_weight=1.0, temperature=1.0, grad=True, inv_n=None):
    """Stage 3's loss on rows of logits and its gradient, fused, outside autograd (distill_loss
    below wraps it): returns (ce, kl, dz).

    z (student) and t (teacher, or None for cross-entropy alone) [N, V]; y [N] targets, -1 where a
    row does not count. ce and kl are means over the rows that count (kl scaled by T^2); dz is the
    gradient of ce_weight * ce + kl_weight * kl in z's dtype, or None when grad is False. inv_n
    (a 0-d fp32 tensor) replaces 1 / (rows that count) in the means and the gradient: z is then a
    slice of a batch of 1 / inv_n counted rows, and ce, kl its parts of the batch's means.
    """
    _distill_check(z, t, y)
    _, ce, kl, dz = _distill_loss_op(z, t, y, float(ce_weight), float(kl_weight), float(temperature), grad,
                                     inv_n)
    return ce, kl, dz if grad else None


def distill_loss(z, t, y, ce_weight=1.0, kl_weight=1.0, temperature=1.0):
    """Stage 3's loss, differentiable in z: (loss, ce, kl) with loss = ce_weight * ce + kl_weight * kl,
    ce and kl as distill_loss_grad gives them (not differentiable, to log).

    z, t [N, V] logits (t None: cross-entropy alone, kl 0), y [N], -1 where a row does not count.
    The forward computes the gradient in closed form with the loss and keeps it (in z's dtype, not
    autograd's fp32 copies of the [N, V] logits); the backward scales it by the incoming gradient.
    """
    _distill_check(z, t, y)
    grad = torch.is_grad_enabled() and z.requires_grad
    loss, ce, kl, _ = _distill_loss_op(z, t, y, float(ce_weight), float(kl_weight), float(temperature), grad)
    return loss, ce, kl


HEAD_ROWS = 4096  # rows of logits at a time in head_loss: [4096, V] in flight, not [B*T, V]


def _add_product(acc, a, b):
    """acc += a @ b, acc fp32 and a, b maybe bf16: the product summed into acc in fp32, never
    rounded to a's dtype first. On CUDA the GEMM adds into acc itself (its fp32 accumulator, one
    pass over acc); elsewhere through an fp32 product."""
    if a.is_cuda and a.dtype != acc.dtype:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:  # the casts are no-ops where a is acc's dtype
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


class _HeadLoss(torch.autograd.Function):
    """head_loss's loss with its gradient computed in the forward, a slice of rows at a time
    (the backward only scales the kept gradients by the incoming one)."""

    @staticmethod
    def forward(ctx, h, weight, t_h, t_weight, y, ce_weight, kl_weight, temperature, rows, grad):
        on = torch.is_autocast_enabled(h.device.type)
        dtype = torch.get_autocast_dtype(h.device.type) if on else h.dtype
        w = weight.to(dtype)
        tw = None if t_h is None else t_weight.to(dtype)
        inv_n = 1.0 / (y >= 0).sum().clamp(min=1).float()  # on the device: no host sync
        ce, kl = h.new_zeros((), dtype=torch.float32), h.new_zeros((), dtype=torch.float32)
        dh = torch.empty_like(h) if grad else None
        dw = torch.zeros_like(weight, dtype=torch.float32) if grad and weight.requires_grad else None
        for i in range(0, h.shape[0], rows):
            h_i = h[i:i + rows].to(dtype)
            z = h_i @ w.t()  # (rows, V): these rows' logits, made and dropped here
            t = None if t_h is None else t_h[i:i + rows].to(dtype) @ tw.t()
            ce_i, kl_i, dz = distill_loss_grad(z, t, y[i:i + rows], ce_weight, kl_weight, temperature,
                                               grad=grad, inv_n=inv_n)
            ce, kl = ce + ce_i, kl + kl_i
            if not grad:
                continue
            dh[i:i + rows] = dz @ w
            if dw is not None:
                _add_product(dw, dz.t(), h_i)
        ctx.save_for_backward(dh, dw)
        ctx.mark_non_differentiable(ce, kl)
        return ce_weight * ce + kl_weight * kl, ce, kl

    @staticmethod
    def backward(ctx, dloss, _dce, _dkl):
        dh, dw = ctx.saved_tensors
        dh = dh * dloss.to(dh.dtype) if ctx.needs_input_grad[0] else None
        dw = dw * dloss if dw is not None else None
        return dh, dw, None, None, None, None, None, None, None, None


def head_loss(h, weight, targets, t_h=None, t_weight=None, ce_weight=1.0, kl_weight=1.0, temperature=1.0,
              rows=HEAD_ROWS):
    """distill.distill_loss of the logits h @ weight.T against the teacher's t_h @ t_weight.T,
    without ever holding them whole: (loss, ce, kl), differentiable in h and weight. What the
    stage-3, sft and lm losses run on the triton backend (distill.StageLoss.from_hidden).

    h [B, T, C] the student's final hidden states (model.hidden), weight [V, C] its LM head;
    t_h, t_weight the teacher's (None: cross-entropy alone, kl 0); targets [B, T], -1: no loss.
    `rows` rows of logits at a time are made, scored by the fused kernel (distill_loss_grad) and
    dropped, with their gradients to h and weight; a [B*T, V] tensor (3 GB at 64 x 512 tokens in
    bf16) never exists, nor its gradient, nor the teacher's.
    """
    t_h = None if t_h is None else t_h.flatten(0, 1)
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    return _HeadLoss.apply(h.flatten(0, 1), weight, t_h, t_weight, targets.flatten(), float(ce_weight),
                           float(kl_weight), float(temperature), int(rows), grad)


# Norms over the last axis, with an optional gate, for rows of D <= 1024 (one block a row):
#     y = x * r * w * act(z),   r = 1 / sqrt(c * sum(x^2) + eps)
# RMSNorm: c = 1 / D (mixers' per-head output norm, then the SiLU or sigmoid output gate);
# L2 normalization: c = 1, no weight (the delta rules' unit q and k). With xh = x * r and
# dxh = dy * w * act(z) the backward is
#     dx = r * (dxh - c * xh * sum(dxh * xh)),  dw = sum over rows of dy * act(z) * xh,
#     dz = dy * x * r * w * act'(z)
# Eager PyTorch runs each norm as seven to ten fp32 passes over the activations; here one.

_NORM_ACTS = {None: 0, "silu": 1, "sigmoid": 2}


@triton.jit
def _norm_fwd_kernel(x, w, z, y, N, D, ZH, SZ, c, eps, HAS_W: tl.constexpr, ACT: tl.constexpr,
                     BR: tl.constexpr, BD: tl.constexpr):
    """x, y [N, D] contiguous; z [N, D] in groups of ZH rows, the groups SZ elements apart (the
    heads of a token in a slice of a wider projection); w [D] or unused. One program: BR rows."""
    c, eps = tl.cast(c, tl.float32), tl.cast(eps, tl.float32)  # fp64 under torch.compile
    o_r, o_d = tl.program_id(0) * BR + tl.arange(0, BR), tl.arange(0, BD)
    m = (o_r < N)[:, None] & (o_d < D)[None, :]
    o = o_r.to(tl.int64)[:, None] * D + o_d[None, :]
    o_z = _norm_z_rows(o_r, D, ZH, SZ)[:, None] + o_d[None, :]
    b_x = tl.load(x + o, mask=m, other=0.0).to(tl.float32)
    b_y = b_x / tl.sqrt(c * tl.sum(b_x * b_x, axis=1) + eps)[:, None]
    if HAS_W:
        b_y *= tl.load(w + o_d, mask=o_d < D, other=0.0).to(tl.float32)[None, :]
    if ACT > 0:
        b_a, _ = _act(tl.load(z + o_z, mask=m, other=0.0).to(tl.float32), ACT)
        b_y *= b_a
    tl.store(y + o, b_y.to(y.dtype.element_ty), mask=m)


@triton.jit
def _norm_bwd_kernel(x, w, z, dy, dx, dwp, dz, N, D, ZH, SZ, c, eps, HAS_W: tl.constexpr, ACT: tl.constexpr,
                     BR: tl.constexpr, BD: tl.constexpr):
    """dx, dz [N, D] contiguous (z read as in the forward); dwp [programs, D] fp32, this
    program's share of dw (summed by the caller)."""
    c, eps = tl.cast(c, tl.float32), tl.cast(eps, tl.float32)  # fp64 under torch.compile
    i_p = tl.program_id(0)
    o_r, o_d = i_p * BR + tl.arange(0, BR), tl.arange(0, BD)
    m_d = o_d < D
    m = (o_r < N)[:, None] & m_d[None, :]
    o = o_r.to(tl.int64)[:, None] * D + o_d[None, :]
    b_x = tl.load(x + o, mask=m, other=0.0).to(tl.float32)
    b_dy = tl.load(dy + o, mask=m, other=0.0).to(tl.float32)
    b_r = 1 / tl.sqrt(c * tl.sum(b_x * b_x, axis=1) + eps)  # [BR]
    b_xh = b_x * b_r[:, None]
    b_yn = b_xh  # the norm's output, before the gate
    if HAS_W:
        b_w = tl.load(w + o_d, mask=m_d, other=0.0).to(tl.float32)[None, :]
        b_yn = b_xh * b_w
    if ACT > 0:  # the gate's gradient, then the gradient through it
        b_a, b_da = _act(tl.load(z + _norm_z_rows(o_r, D, ZH, SZ)[:, None] + o_d[None, :], mask=m, other=0.0)
                         .to(tl.float32), ACT)
        tl.store(dz + o, (b_dy * b_yn * b_da).to(dz.dtype.element_ty), mask=m)
        b_dy *= b_a
    b_dxh = b_dy
    if HAS_W:
        tl.store(dwp + i_p.to(tl.int64) * D + o_d, tl.sum(b_dy * b_xh, axis=0), mask=m_d)
        b_dxh = b_dy * b_w
    b_dx = b_r[:, None] * (b_dxh - c * b_xh * tl.sum(b_dxh * b_xh, axis=1)[:, None])
    tl.store(dx + o, b_dx.to(dx.dtype.element_ty), mask=m)


@triton.jit
def _norm_z_rows(o_r, D, ZH, SZ):
    """The offsets of rows o_r of z: row r is head r % ZH of group r // ZH."""
    o_r = o_r.to(tl.int64)
    return (o_r // ZH) * SZ + (o_r % ZH) * D


def _norm_gate_rows(z, D):
    """z [..., H, D] as (tensor, ZH, SZ) for the kernels: groups of ZH rows of D contiguous
    channels, SZ elements apart, without a copy where z's strides allow (a gate sliced from a
    wider projection), else a contiguous copy."""
    if z is None:
        return None, 1, D
    zr = z.reshape(-1, *z.shape[-2:]) if z.dim() > 2 else z.reshape(-1, 1, D)  # [groups, heads, D], a view if it can
    if zr.stride(2) != 1 or zr.stride(1) != D:
        zr = zr.contiguous()
    return zr, zr.shape[1], zr.stride(0)


_NORM_BLOCK = 4096  # elements per program: rows of D <= 1024 grouped to about this many
_NORM_WARPS = 4  # warps per program


def _norm_rows(D):
    """Rows per program: about _NORM_BLOCK elements a block."""
    BD = triton.next_power_of_2(D)
    return max(1, _NORM_BLOCK // BD), BD


@_op("norm_fwd")
def _norm_fwd(x: torch.Tensor, w: Optional[torch.Tensor], z: Optional[torch.Tensor], c: float, eps: float,
              act: int) -> torch.Tensor:
    """y = x * r * w * act(z) over the last axis, r = 1 / sqrt(c * sum(x^2) + eps); act a code of
    _NORM_ACTS (0: no gate)."""
    shape, D = x.shape, x.shape[-1]
    x = x.reshape(-1, D).contiguous()
    z, ZH, SZ = _norm_gate_rows(z, D)
    N = x.shape[0]
    BR, BD = _norm_rows(D)
    y = torch.empty_like(x)
    # x stands in as the pointer of an absent weight or gate (HAS_W, ACT say which are read)
    _norm_fwd_kernel[(triton.cdiv(N, BR),)](x, x if w is None else w, x if z is None else z, y, N, D, ZH, SZ, c,
                                            eps, HAS_W=w is not None, ACT=act, BR=BR, BD=BD,
                                            num_warps=_NORM_WARPS)
    return y.view(shape)


@_norm_fwd.register_fake
def _(x, w, z, c, eps, act):
    return x.new_empty(x.shape)


@_op("norm_bwd")
def _norm_bwd(dy: torch.Tensor, x: torch.Tensor, w: Optional[torch.Tensor], z: Optional[torch.Tensor], c: float,
              eps: float, act: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, dz), dw absent without a weight and dz without a gate."""
    shape, D = x.shape, x.shape[-1]
    x = x.reshape(-1, D).contiguous()
    zr, ZH, SZ = _norm_gate_rows(z, D)
    N = x.shape[0]
    BR, BD = _norm_rows(D)
    grid = triton.cdiv(N, BR)
    dx = torch.empty_like(x)
    dz = None if z is None else torch.empty(N, D, device=z.device, dtype=z.dtype)
    dwp = None if w is None else torch.empty(grid, D, device=x.device, dtype=torch.float32)
    _norm_bwd_kernel[(grid,)](x, x if w is None else w, x if zr is None else zr, dy.reshape(-1, D).contiguous(),
                              dx, x if dwp is None else dwp, x if dz is None else dz, N, D, ZH, SZ, c,
                              eps, HAS_W=w is not None, ACT=act, BR=BR, BD=BD, num_warps=_NORM_WARPS)
    dw = _absent(x) if w is None else dwp.sum(0).to(w.dtype).view(w.shape)
    dz = _absent(x) if z is None else dz.view(z.shape)
    return dx.view(shape), dw, dz


@_norm_bwd.register_fake
def _(dy, x, w, z, c, eps, act):
    return (x.new_empty(x.shape), _absent(x) if w is None else w.new_empty(w.shape),
            _absent(x) if z is None else z.new_empty(z.shape))


def _norm_setup(ctx, inputs, output):
    x, w, z, c, eps, act = inputs
    ctx.save_for_backward(x, w, z)
    ctx.c, ctx.eps, ctx.act = c, eps, act


def _norm_backward(ctx, dy):
    x, w, z = ctx.saved_tensors
    dx, dw, dz = _norm_bwd(dy, x, w, z, ctx.c, ctx.eps, ctx.act)
    return dx, None if w is None else dw, None if z is None else dz, None, None, None


_norm_fwd.register_autograd(_norm_backward, setup_context=_norm_setup)


def rms_norm_gate(x, weight, z=None, act=None, eps=1e-5):
    """RMSNorm over the last axis (fp32 inside), times an optional gate act(z), act "silu" or
    "sigmoid": y = x / sqrt(mean(x^2) + eps) * weight * act(z), in x's dtype. x, z [..., D]."""
    assert act in _NORM_ACTS and (z is None) == (act is None), "a gate z needs act 'silu' or 'sigmoid'"
    return _norm_fwd(x, weight, z, 1.0 / x.shape[-1], float(eps), _NORM_ACTS[act])


def l2_normalize(x, eps=1e-24):
    """x / sqrt(|x|^2 + eps) over the last axis (fp32 inside), in x's dtype: F.normalize(x, dim=-1),
    whose floor on |x| is 1e-12 = sqrt(eps), wherever |x| is not near that floor."""
    return _norm_fwd(x, None, None, 1.0, float(eps), 0)


# The log decays that Gated DeltaNet (one per head) and KDA (one per key channel) make, with
# x = a + dt_bias, A = exp(A_log[h]), a [N, H * K] (K = 1: per head):
#     Mamba-2's   g = -A * softplus(x)                   (floor = 0: unbounded below)
#         da = ddt_bias (before the sum over rows) = -A * sigmoid(x) * dg,   dA_log = sum(dg * g)
#     bounded     g = floor * sigmoid(A x), in (floor, 0) (Kimi Linear's, floor < 0)
#         da = floor * s (1 - s) * A * dg with s = sigmoid(A x),             dA_log = sum(da * x)
# Eager PyTorch runs either as four to five passes and about eight backward; here one each.


@triton.jit
def _decay_pre(a, A_log, dt_bias, o_r, o_c, m_r, m_c, SA, K: tl.constexpr):
    """x = a + dt_bias and A = exp(A_log[head]) at rows o_r, channels o_c (a's rows SA apart), fp32."""
    m_x = m_r[:, None] & m_c[None, :]
    b_x = tl.load(a + o_r.to(tl.int64)[:, None] * SA + o_c[None, :], mask=m_x, other=0.0).to(tl.float32)
    b_x += tl.load(dt_bias + o_c, mask=m_c, other=0.0)[None, :]
    b_A = tl.exp(tl.load(A_log + o_c // K, mask=m_c, other=0.0))[None, :]
    return b_x, b_A, m_x


@triton.jit
def _softplus(x):
    # past F.softplus's threshold of 20: x; exp(x) where 1 + exp(x) rounds to 1 in fp32
    return tl.where(x > 20.0, x, tl.where(x < -15.0, tl.exp(x), tl.log(1 + tl.exp(tl.minimum(x, 20.0)))))


@triton.jit
def _decay_fwd_kernel(a, A_log, dt_bias, g, floor, N, HK, SA, K: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                      BOUNDED: tl.constexpr):
    o_r, o_c = tl.program_id(0) * BR + tl.arange(0, BR), tl.program_id(1) * BC + tl.arange(0, BC)
    b_x, b_A, m_x = _decay_pre(a, A_log, dt_bias, o_r, o_c, o_r < N, o_c < HK, SA, K)
    if BOUNDED:
        b_g = floor * tl.sigmoid(b_A * b_x)
    else:
        b_g = -b_A * _softplus(b_x)
    tl.store(g + o_r.to(tl.int64)[:, None] * HK + o_c[None, :], b_g, mask=m_x)


@triton.jit
def _decay_bwd_kernel(a, A_log, dt_bias, dg, da, dAp, dbp, floor, N, HK, SA, K: tl.constexpr, BR: tl.constexpr,
                      BC: tl.constexpr, BOUNDED: tl.constexpr):
    """da [N, HK] in a's dtype; dAp, dbp [programs over rows, HK] fp32: this block's sums of
    dA_log's terms and of da over its rows (the caller sums them)."""
    i_r = tl.program_id(0)
    o_r, o_c = i_r * BR + tl.arange(0, BR), tl.program_id(1) * BC + tl.arange(0, BC)
    b_x, b_A, m_x = _decay_pre(a, A_log, dt_bias, o_r, o_c, o_r < N, o_c < HK, SA, K)
    o_x = o_r.to(tl.int64)[:, None] * HK + o_c[None, :]
    b_dg = tl.load(dg + o_x, mask=m_x, other=0.0).to(tl.float32)
    if BOUNDED:
        b_s = tl.sigmoid(b_A * b_x)
        b_dx = floor * b_s * (1 - b_s) * b_A * b_dg
        b_dA = b_dx * b_x
    else:
        b_dx = tl.where(b_x > 20.0, 1.0, tl.sigmoid(b_x)) * -b_A * b_dg
        b_dA = b_dg * -b_A * _softplus(b_x)
    tl.store(da + o_x, b_dx.to(da.dtype.element_ty), mask=m_x)
    tl.store(dAp + i_r.to(tl.int64) * HK + o_c, tl.sum(b_dA, axis=0), mask=o_c < HK)
    tl.store(dbp + i_r.to(tl.int64) * HK + o_c, tl.sum(b_dx, axis=0), mask=o_c < HK)


_DECAY_BR, _DECAY_BC = 64, 64  # rows and channels per program
_DECAY_WARPS = 4  # warps per program


def _decay_launch(a, A_log, dt_bias):
    """a as the kernels read it ([N, HK] rows SA apart: a copy only when a[b, t] is not one
    contiguous run), A_log and dt_bias in fp32, the grid and K."""
    H, HK, N = A_log.shape[0], dt_bias.numel(), a.shape[0] * a.shape[1]
    rows = a.stride(0) == a.shape[1] * a.stride(1) and a[0, 0].is_contiguous()  # [N, HK] rows, strided
    a2 = a if rows else a.contiguous()
    BC = min(_DECAY_BC, triton.next_power_of_2(HK))
    grid = (triton.cdiv(N, _DECAY_BR), triton.cdiv(HK, BC))
    return a2, A_log.float().contiguous(), dt_bias.float().contiguous(), N, HK, HK // H, BC, grid


@_op("log_decay_fwd")
def _decay_fwd(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, floor: float) -> torch.Tensor:
    a2, A32, b32, N, HK, K, BC, grid = _decay_launch(a, A_log, dt_bias)
    g = torch.empty(a.shape, device=a.device, dtype=torch.float32)
    _decay_fwd_kernel[grid](a2, A32, b32, g, floor, N, HK, a2.stride(1), K=K, BR=_DECAY_BR, BC=BC,
                            BOUNDED=floor < 0, num_warps=_DECAY_WARPS)
    return g


@_decay_fwd.register_fake
def _(a, A_log, dt_bias, floor):
    return a.new_empty(a.shape, dtype=torch.float32)


@_op("log_decay_bwd")
def _decay_bwd(dg: torch.Tensor, a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, floor: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(da, dA_log, ddt_bias) in the inputs' dtypes."""
    a2, A32, b32, N, HK, K, BC, grid = _decay_launch(a, A_log, dt_bias)
    H = A32.shape[0]
    da = torch.empty(a.shape, device=a.device, dtype=a.dtype)
    dAp = torch.empty(grid[0], HK, device=a.device, dtype=torch.float32)
    dbp = torch.empty_like(dAp)
    _decay_bwd_kernel[grid](a2, A32, b32, dg.contiguous(), da, dAp, dbp, floor, N, HK, a2.stride(1), K=K,
                            BR=_DECAY_BR, BC=BC, BOUNDED=floor < 0, num_warps=_DECAY_WARPS)
    dA = dAp.sum(0).view(H, K).sum(1)
    return da, dA.to(A_log.dtype), dbp.sum(0).to(dt_bias.dtype).view(dt_bias.shape)


@_decay_bwd.register_fake
def _(dg, a, A_log, dt_bias, floor):
    return a.new_empty(a.shape), A_log.new_empty(A_log.shape), dt_bias.new_empty(dt_bias.shape)


def _decay_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.floor = inputs[3]


def _decay_backward(ctx, dg):
    return *_decay_bwd(dg, *ctx.saved_tensors, ctx.floor), None


_decay_fwd.register_autograd(_decay_backward, setup_context=_decay_setup)


def _check_decay(a, A_log, dt_bias):
    assert a.dim() in (3, 4) and A_log.shape == (a.shape[2],) and dt_bias.numel() == a[0, 0].numel(), \
        f"a {tuple(a.shape)}, A_log {tuple(A_log.shape)}, dt_bias {tuple(dt_bias.shape)}"


def sigmoid_decay(a, A_log, dt_bias, floor):
    """floor * sigmoid(exp(A_log) * (a + dt_bias)) in fp32, in (floor, 0) for floor < 0 (Kimi
    Linear's bounded log decay), with a, A_log, dt_bias as softplus_decay takes them."""
    _check_decay(a, A_log, dt_bias)
    assert floor < 0, f"floor={floor}: a bounded log decay needs floor < 0"
    return _decay_fwd(a, A_log, dt_bias, float(floor))


def softplus_decay(a, A_log, dt_bias):
    """-exp(A_log) * softplus(a + dt_bias) in fp32 (Mamba-2's log decay, <= 0): a [B, T, H] with
    A_log, dt_bias [H], or a [B, T, H, K] with A_log [H] and dt_bias [H * K] (one per channel).
    a's rows may be strided (a slice of a wider projection)."""
    _check_decay(a, A_log, dt_bias)
    return _decay_fwd(a, A_log, dt_bias, 0.0)
