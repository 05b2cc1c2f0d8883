"""OpInfo samples that do not match the CPU on rbln, each with its reason.

Keys: ``(opinfo name[.variant], dtype)``; dtype ``"*"`` covers all three.
"""

# Ops whose values are not determined by their inputs: random draws (rbln draws from its own
# device generator, as CUDA would) and uninitialised memory (``empty*``). Only shapes and
# dtypes are compared.
RANDOM_OPS = frozenset({
    "bernoulli", "normal", "normal.number_mean", "uniform", "rand_like", "randn_like",
    "randint_like", "randint", "multinomial", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "nn.functional.rrelu", "cauchy", "exponential", "geometric", "log_normal",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "randn", "rand",
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
})

_SPARSE = ("sparse layouts are not supported: an rbln storage holds strided tensors only "
           "(the sample cannot even be built on rbln)")

KNOWN: dict = {
    ("to_sparse", "*"): _SPARSE,
    ("sparse.mm.reduce", "*"): _SPARSE,
    ("sparse.sampled_addmm", "*"): _SPARSE,
}

# Input gradients (``test_opinfo_grad``) that do not match the CPU's, each with its reason.
KNOWN_GRAD: dict = {
    ("to_sparse", "*"): _SPARSE,
    ("sparse.mm.reduce", "*"): _SPARSE,
    ("sparse.sampled_addmm", "*"): _SPARSE,
}
