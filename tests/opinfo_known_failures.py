"""OpInfo samples that do not match the CPU on rbln, each with its reason.

Keys: ``(opinfo name[.variant], dtype)``; dtype ``"*"`` covers all three.
"""

# Ops whose values come from a random generator: rbln draws from its own device generator
# (as CUDA would), so only shapes and dtypes are compared.
RANDOM_OPS = frozenset({
    "bernoulli", "normal", "normal.number_mean", "uniform", "rand_like", "randn_like",
    "randint_like", "randint", "multinomial", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "nn.functional.rrelu", "cauchy", "exponential", "geometric", "log_normal",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "randn", "rand",
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
    "nn.functional.multi_head_attention_forward", "torch._scaled_mm",
})

_SPARSE = ("sparse layouts are not supported: an rbln storage holds strided tensors only "
           "(the sample cannot even be built on rbln)")

KNOWN: dict = {
    ("to_sparse", "*"): _SPARSE,
    ("sparse.mm.reduce", "*"): _SPARSE,
    ("sparse.sampled_addmm", "*"): _SPARSE,
}
