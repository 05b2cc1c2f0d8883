"""What each signal means for the user and what to change: report labels, the short ``try:``
hints of the table, and the full remedies behind ``help()`` and ``dump()["notes"]``."""

from __future__ import annotations

# Torch-side host bounce sites, in report order; each is a host round trip.
BOUNCE_SITES = ("copy_d2d_host_bounce", "copy_h2d_staging", "copy_h2d_noncontig_dst",
                "strided_v2v_cpu_fallback")

BOUNCE_LABEL = {
    "copy_d2d_host_bounce": "host_bounce/d2d_copy",
    "copy_h2d_staging": "host_bounce/h2d_staging",
    "copy_h2d_noncontig_dst": "host_bounce/h2d_noncontig_dst",
    "strided_v2v_cpu_fallback": "host_bounce/strided_v2v_cpu_fallback",
}

# Why a device-to-device copy had to go through the host (runtime side), in report order.
# The axis is the reference's, and verdict() prints every cause of it:
# ``src_device_only_real_d2h`` stays although no copy here needs it (the virtual NPU plans
# every same-dtype contiguous device copy).
V2V_CAUSES = ("src_not_on_device", "src_device_only_real_d2h", "src_synced_host_served")

# Reasons the runtime rejects a fast copy plan (each one the user can act on).
USER_REJECTS = ("src_not_on_device", "dtype_mismatch")

# Pre-dispatch check reasons listed first in ``why:`` (any other code follows, by count).
REASON_ORDER = ("dtype-not-fp16", "nan/inf input", "all-scalar inputs")

SHORT_FIX = {
    "copy_d2d_host_bounce": "make contiguous, or v2v engine",
    "copy_h2d_staging": "keep src on-device / stage once",
    "copy_h2d_noncontig_dst": "contiguous staging, then h2d",
    "strided_v2v_cpu_fallback": "lower outer_count / fatter inner",
    "cpu_fallback": "graph mode, or a supported dtype",
    "recompile": "stabilize shapes, or graph mode",
    "v2v_slow": "establish device residency first",
}

REMEDY = {
    "copy_d2d_host_bounce":
        "a device-to-device copy could not run on the device (dtype conversion, broadcast or "
        "strided layout) and went through host memory; convert dtypes before moving tensors to "
        "rbln, keep both sides contiguous with the same dtype and shape (e.g. a contiguous KV "
        "layout) so the on-device v2v engine takes the copy",
    "copy_h2d_staging":
        "a CPU source had to be converted (dtype or layout) on the host before the upload; "
        "create the tensor on rbln directly, or convert it once (.to(dtype).contiguous()) and "
        "reuse the staged copy instead of re-uploading every step",
    "copy_h2d_noncontig_dst":
        "a host-to-device write landed in a non-contiguous rbln view, which is written on the "
        "host side; copy into a contiguous rbln buffer first, then rearrange it on the device",
    "strided_v2v_cpu_fallback":
        "a strided device-to-device copy (cat/index/copy_) ran on the CPU; use fewer, larger "
        "contiguous inner blocks (a lower outer count) so the device copy engine qualifies",
    "cpu_fallback":
        "ops ran on the CPU instead of the NPU; run the step in graph mode "
        "(torch.compile(model, backend='rbln')), convert to a supported dtype (float16 or "
        "bfloat16) before .to('rbln') or run a float32 model under "
        "torch.autocast('rbln', dtype=torch.bfloat16) (its matmuls then run on the NPU), and "
        "meet the op's input rules (see why:); ops that are host-only by nature (argmax, "
        "sampling) are expected here",
    "recompile":
        "programs were compiled for new (op, shape, dtype) keys; one cold compile per key is "
        "expected, but compiles in a steady loop mean the shapes keep changing: pad or bucket "
        "them to a few stable sizes, or use graph mode",
}

CAUSE_FIX = {
    "src_not_on_device":
        "the copy's source was host-latest; make it device-resident (let a device op produce it, "
        "or upload it once) before copying it on the device",
    "src_device_only_real_d2h":
        "the source lived only on the device and the copy needed a real device-to-host transfer "
        "(the layout could not be planned on the device: dtype, alignment or too many pieces); "
        "align dtypes and keep the copy contiguous",
    "src_synced_host_served":
        "the source was in sync on host and device, so a host memcpy served the copy with no "
        "transfer; usually harmless, make the source device-resident to use the device engine",
}

# What to change for each part of a cache key that made an op compile again (``dim N`` uses
# "dim").
RECOMPILE_FIX = {
    "dim": "pad or bucket {part} to a few sizes, or graph mode with dynamic shapes "
           "(torch.compile(backend=\"rbln\", dynamic=True))",
    "shape": "keep the number of dimensions the same on every call, or graph mode with "
             "dynamic shapes",
    "baked value": "pass it as a device tensor (torch.tensor(v, device=\"rbln\")): a CPU scalar's "
              "value is baked into the program",
    "value": "this argument is part of the program: keep it constant, or pass it as a device "
             "tensor where the op takes one",
    "dtype": "convert to one dtype once, before the loop",
    "contiguity": "make the input contiguous (.contiguous()) the same way on every call",
    "alias": "pass the same tensor twice, or two tensors, the same way on every call",
    "kind": "call the op the same way every time (a tensor, a scalar or None in one slot)",
    "index": "each device compiles its own programs: expected once per device",
    "count": "call the op with the same arguments every time",
}


def recompile_cause_fix(part: str) -> str:
    """What to change when ``part`` of an argument varies between an op's compiles."""
    if part.startswith("dim "):
        return RECOMPILE_FIX["dim"].format(part=part)
    return RECOMPILE_FIX.get(part, "keep the op's arguments the same on every call")


REJECT_FIX = {
    "src_not_on_device": "establish device residency before the copy",
    "dtype_mismatch": "align the src/dst dtype",
}


# cpu_fallback when graph mode would not help: every fallback ran inside a compiled graph
# already, or none of the ops is one the RBLN compiler accelerates
GRAPH_FIX = {
    "graph-dtype": "cast to fp16/bf16 (already graph mode)",
    "graph": "host op in graph mode too; see why:",
    "not-accelerated": "host op in graph mode too; see why:",
}
GRAPH_REMEDY = {
    "graph-dtype":
        "these ops ran on the host inside a compiled graph: graph mode keeps the eager dtype "
        "rule, so convert the chain to float16 or bfloat16 (e.g. an fp32 RMSNorm chain in an "
        "fp16 model: compute it in fp16, or accept its host run); see why: and the graph mode "
        "lines for each node's reason",
    "graph":
        "these ops ran on the host inside a compiled graph: the RBLN compiler's table does not "
        "accelerate them (see the graph mode lines for each node's row); they are expected "
        "there unless the model can avoid them",
    "not-accelerated":
        "ops ran on the CPU that the RBLN compiler does not accelerate either, so graph mode "
        "would not move them; meet the op's input rules (why: names the failed one: a supported "
        "dtype such as float16, a layout), or accept the host run for ops that are host-only "
        "by nature",
}


def fallback_case(d: dict) -> str:
    """Which advice fits the region's CPU fallbacks: ``"eager"`` (graph mode may help: one of
    the ops is one the compiler accelerates or an eager device op), ``"graph-dtype"`` /
    ``"graph"`` (all ran inside compiled graphs), or ``"not-accelerated"``."""
    from ..dispatch.compiler_optable import accelerates
    from ..dispatch.optable import BY_NAME
    in_graph: dict[str, int] = {}
    for r in d.get("graph", {}).get("nodes", ()):
        if r["where"] == "host":
            in_graph[r["op"]] = in_graph.get(r["op"], 0) + r["count"]
    eager = [op for op, n in d["cpu_fallback_by_op"].items() if n > in_graph.get(op, 0)]
    if not eager:
        return "graph-dtype" if "dtype-not-fp16" in d["cpu_fallback_reasons"] else "graph"
    if any(accelerates(op) or op.split("::", 1)[-1] in BY_NAME for op in eager):
        return "eager"
    return "not-accelerated"


def fallback_fix(d: dict) -> tuple[str, str]:
    """The ``try:`` hint and the remedy of the region's CPU fallbacks."""
    case = fallback_case(d)
    if case == "eager":
        return SHORT_FIX["cpu_fallback"], REMEDY["cpu_fallback"]
    return GRAPH_FIX[case], GRAPH_REMEDY[case]


GRAPH_RECOMPILE_FIX = "stabilize shapes, or dynamic=True"
GRAPH_RECOMPILE_REMEDY = (
    "compiled graphs were built for new shapes, dtypes or failed guards; one compile per graph "
    "is expected, but compiles in a steady loop mean the shapes keep changing: pad or bucket "
    "them to a few stable sizes, or compile with dynamic=True")


def recompile_fix(d: dict) -> tuple[str, str]:
    """The ``try:`` hint and remedy of the region's compiles: graph mode is not suggested to
    graphs (``graph 0/1`` ...)."""
    if d["recompile_by_op"] and all(k.startswith("graph ") for k in d["recompile_by_op"]):
        return GRAPH_RECOMPILE_FIX, GRAPH_RECOMPILE_REMEDY
    return SHORT_FIX["recompile"], REMEDY["recompile"]


def notes(d: dict) -> list[dict]:
    """The fired signals with their remedy, host bounces first, then runtime, then dispatch."""
    out = []
    for site, c in d["hidden_host_bounce"]["by_site"].items():
        if c["count"]:
            out.append({"signal": f"host_bounce/{site}", "fix": REMEDY[site]})
    rr = d["runtime_residency"]
    for cause, c in rr["by_reason"].items():
        if c["count"]:
            out.append({"signal": f"runtime/v2v_slow:{cause}", "fix": CAUSE_FIX[cause]})
    for label in rr["reject"]["user_actionable"]:
        out.append({"signal": f"runtime/v2v_reject:{label}", "fix": REJECT_FIX[label]})
    if d["dispatch"]["cpu_fallback"]:
        out.append({"signal": "dispatch/cpu_fallback", "fix": fallback_fix(d)[1]})
    if d["dispatch"]["recompile_miss"]:
        out.append({"signal": "dispatch/recompile", "fix": recompile_fix(d)[1]})
    return out


def lookup(signal: str, fired: list[dict]) -> str:
    """The remedy for ``signal``: a site key, a cause, a reject label or a report signal such as
    ``dispatch/cpu_fallback`` or ``runtime/v2v_slow:src_not_on_device``."""
    for n in fired:             # the region's own advice first (graph mode changes it)
        if n["signal"] == signal:
            return n["fix"]
    key = signal.rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    for table in (REMEDY, CAUSE_FIX, REJECT_FIX):
        if key in table:
            return table[key]
    for n in fired:
        if signal in n["signal"]:
            return n["fix"]
    return f"no remedy for '{signal}'"
