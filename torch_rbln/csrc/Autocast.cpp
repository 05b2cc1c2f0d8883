// torch.autocast("rbln"): the AutocastPrivateUse1 kernels. Each casts its op's floating rbln
// operands as CUDA's autocast does and redispatches below autocast. PyTorch accepts these only
// from C++: they are its own wrappers (ATen/autocast_mode.h), which share the weight cast cache
// that torch.autocast clears at exit. The op lists are the macros CUDA's registration expands,
// so rbln casts exactly the ops CUDA casts, in this torch's version of the lists, with the same
// policy each. Not taken: cudnn_convolution and cudnn_convolution_transpose, ops of CUDA's own
// (torch_rbln/amp.py names them; docs/torch-rbln.md "Autocast").
#include <ATen/autocast_mode.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

namespace py = pybind11;

namespace torch_rbln {

namespace {

// binary_cross_entropy is refused under autocast, as on CUDA: its input is usually a sigmoid's
// output, which the lower precision rounds to exactly 0 or 1, where the loss is infinite.
at::Tensor binary_cross_entropy_refused(const at::Tensor&, const at::Tensor&,
                                        const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
      "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast "
      "(on rbln as on CUDA): a sigmoid's output in float16/bfloat16 rounds to 0 or 1, where "
      "the loss is infinite. Give the logits to torch.nn.functional."
      "binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss instead (they run in "
      "float32 under autocast), or compute this loss outside the autocast region.");
}

void register_kernels(torch::Library& m) {
#define RBLN_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define RBLN_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define RBLN_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define RBLN_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(RBLN_LOWER_PRECISION_FP)
  AT_FORALL_FP32(RBLN_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(RBLN_FP32_SET_OPT_DTYPE)
  // norm overloads without a dtype: redispatched to the overload with one, dtype float32 (the
  // list spells its signatures with at::'s names unqualified)
  using at::IntArrayRef;
  using at::Scalar;
  using at::ScalarType;
  using at::Tensor;
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(RBLN_PROMOTE)
#undef RBLN_LOWER_PRECISION_FP
#undef RBLN_FP32
#undef RBLN_FP32_SET_OPT_DTYPE
#undef RBLN_PROMOTE
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN(binary_cross_entropy_refused));
}

}  // namespace

void bind_autocast(py::module_& m) {
  m.def("register_autocast", [] {
    // once per process: the libraries live as long as it does (the dispatcher holds them)
    static bool done = false;
    if (done) return;
    done = true;
    // every other op passes through autocast untouched, as on CUDA
    static auto* all = new torch::Library(torch::Library::IMPL, "_",
                                          c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
    all->fallback(torch::CppFunction::makeFallthrough());
    static auto* aten = new torch::Library(torch::Library::IMPL, "aten",
                                           c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
    register_kernels(*aten);
  }, "Register torch.autocast's kernels for rbln (AutocastPrivateUse1): CUDA's op lists and "
     "policies, and a fallthrough for every other op.");
}

}  // namespace torch_rbln
