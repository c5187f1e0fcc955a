"""A mixer outside the study, to show that the tests follow the registry (tests/test_registry.py):
Mamba-2's recurrence (Dao and Gu 2024, Transformers are SSMs; its SSD layer with B = k, C = q,
x = v), a decayed additive one with a data-dependent decay per head:

    S_t = exp(-A dt_t) S_{t-1} + dt_t k_t v_t^T,   o_t = S_t^T (scale q_t),   dt_t = softplus(a_t + dt_bias)

tests/conftest.py adds LAYERS to mixers' registry when LINEARIZE_EXTRA_MIXERS names this module.
"""

import torch
import torch.nn.functional as F

import mixers


@mixers._fp32
def mamba2_recurrent(q, k, v, g, initial_state=None, scale=None):
    """Mamba-2: S_t = a_t S_{t-1} + k_t v_t^T, one decay a_t per head and token; g = log a [B, T, H]
    (-A dt), the step dt already in k."""
    out_dtype = v.dtype
    q, k, v, S, scale = mixers._prepare(q, k, v, initial_state, scale)
    a = g.to(q.dtype).exp()
    out = []
    for t in range(q.shape[1]):
        S = a[:, t, :, None, None] * S + mixers._outer(k[:, t], v[:, t])
        out.append(mixers._read(S, scale * q[:, t]))
    return torch.stack(out, 1).to(out_dtype), S


class Mamba2(mixers.MixerLayer):
    """Mamba-2's decay and step on the shared layer; RMSNorm times swish gate, as Mamba-2's."""

    name, family, decay = "mamba2", "additive", "head"
    textbook = staticmethod(mamba2_recurrent)
    out_norm, out_gate = "rms", "silu"

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.A_log, self.dt_bias = mixers._A_log(self.n_head), mixers._dt_bias(self.n_head)  # Mamba-2 inits

    def projections(self, H, D):
        return super().projections(H, D) | {"dt": H}

    def gates(self, p, backend):  # [B, T, H] each
        g = mixers.softplus_decay(p["dt"], self.A_log, self.dt_bias, backend=backend)  # -A dt
        return {"g": g, "dt": F.softplus(p["dt"] + self.dt_bias)}

    def recurrence(self, q, k, v, gates, state, backend, step):
        # the step goes into the key, as mLSTM's input gate does: S_t = a_t S_{t-1} + dt_t k_t v_t^T
        k = k * gates["dt"][..., None].to(k.dtype)
        return super().recurrence(q, k, v, {"g": gates["g"]}, state, backend, step)


LAYERS = (Mamba2,)
