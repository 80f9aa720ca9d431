"""Stand-in for numba in the GPU payload: ``jit``/``njit`` leave the function as it is (plain Python)."""


def jit(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda function: function


njit = jit
prange = range
