"""A helper shared by the kernel tests: outputs and every input gradient of one call."""


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
