"""Helpers shared by the kernel tests: outputs and every input gradient of one call, and
per-channel log decays at a bound."""

import torch


def run_and_grad(fn, *args, do, dht=None, **kw):
    """fn(*args, **kw) -> (o, ht); returns o, ht and the gradients of sum(o*do) + sum(ht*dht)
    with respect to every tensor in args (None entries are passed through and skipped)."""
    leaves = [None if a is None else a.detach().clone().requires_grad_(True) for a in args]
    o, ht = fn(*leaves, **kw)
    loss = (o.double() * do.double()).sum()
    if dht is not None:
        loss = loss + (ht.double() * dht.double()).sum()
    loss.backward()
    return o, ht, [x.grad for x in leaves if x is not None]


def bounded_gates(shape, gate_min, device, seed=3):
    """Per-channel log decays in [gate_min, 0], a third of them exactly gate_min (the bound)."""
    gen = torch.Generator(device).manual_seed(seed)
    g = gate_min * torch.rand(*shape, generator=gen, device=device)
    return torch.where(torch.rand(*shape, generator=gen, device=device) < 1 / 3, gate_min, g)
