"""Reading jaxprs in tests: every equation of a program, the Pallas kernels' bodies left out."""


def equations(jaxpr):
    """The equations of ``jaxpr`` and of its sub-jaxprs (scan, custom_vjp, pjit...), outside
    kernels: a pallas_call is yielded, its body is not entered."""
    for eqn in jaxpr.eqns:
        yield eqn
        if eqn.primitive.name == "pallas_call":
            continue
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from equations(inner)
