// torch.autocast(device_type="tpu"): the AutocastPrivateUse1 kernels, with
// CPU autocast's cast policies so that a model autocasts on tpu as on CPU.
//
// The operators CPU autocast handles are read from the dispatcher (those
// with an AutocastCPU kernel), so they follow the installed PyTorch. Each
// gets one boxed kernel that casts the floating tpu tensors among its
// arguments (not float64, as CPU's `is_eligible`) and calls the operator
// again with autocast excluded. CPU's policy for an operator is not
// exposed: those named below cast to the autocast dtype ("lower precision")
// or to the widest floating type of the arguments ("promote"); every other
// one CPU autocast runs in float32.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace torchtpu {
namespace {

constexpr auto kTpu = c10::DeviceType::PrivateUse1;

enum class Policy { LowerPrecision, Fp32, Promote };

// CPU autocast's lower_precision_fp and promote operators (base names).
const std::unordered_set<std::string> kLowerPrecision = {
    "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm", "_addmm_activation",
    "addbmm", "linear", "_convolution", "matmul", "conv_tbc", "mkldnn_rnn_layer", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "prelu", "scaled_dot_product_attention",
    "_native_multi_head_attention"};
const std::unordered_set<std::string> kPromote = {"stack", "cat", "index_copy"};

std::unordered_map<c10::OperatorName, Policy>& policies() {
  static std::unordered_map<c10::OperatorName, Policy> p;
  return p;
}

bool eligible(const at::Tensor& t) {
  return t.defined() && t.device().type() == kTpu && t.is_floating_point() && t.scalar_type() != at::kDouble;
}

// Applies `f` to every tensor argument (tensor lists' elements included).
template <typename F>
void each_tensor(torch::jit::Stack& args, F f) {
  for (auto& v : args) {
    if (v.isTensor()) {
      auto t = v.toTensor();
      f(t);
      v = std::move(t);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t i = 0; i < list.size(); i++) {
        at::Tensor t = list[i];
        f(t);
        list[i] = t;
      }
    } else if (v.isOptionalTensorList()) {
      auto list = v.toOptionalTensorList();
      for (size_t i = 0; i < list.size(); i++) {
        std::optional<at::Tensor> t = list[i];
        if (t.has_value()) {
          f(*t);
          list[i] = t;
        }
      }
    }
  }
}

void autocast(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto policy = policies().at(op.schema().operator_name());
  const auto n = op.schema().arguments().size();
  torch::jit::Stack args(stack->end() - n, stack->end());
  at::ScalarType to = at::autocast::get_autocast_dtype(kTpu);
  if (policy == Policy::Fp32) {
    to = at::kFloat;
  } else if (policy == Policy::Promote) {
    each_tensor(args, [&](at::Tensor& t) {
      if (eligible(t)) to = at::promote_types(to, t.scalar_type());
    });
  }
  each_tensor(args, [&](at::Tensor& t) {
    if (eligible(t) && t.scalar_type() != to) t = t.to(to);
  });
  std::move(args.begin(), args.end(), stack->end() - n);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastPrivateUse1);
  op.callBoxed(stack);
}

// Registers the kernels at load time, after torch's own (AutocastCPU's).
struct Registrar {
  torch::Library lib{torch::Library::IMPL, "aten", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__};
  Registrar() {
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const auto& name : dispatcher.getRegistrationsForDispatchKey(c10::DispatchKey::AutocastCPU)) {
      const std::string base = name.name.substr(name.name.find("::") + 2);
      policies()[name] = kLowerPrecision.count(base) ? Policy::LowerPrecision
                         : kPromote.count(base)      ? Policy::Promote
                                                     : Policy::Fp32;
      const auto full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
      lib.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&autocast>());
    }
  }
};

const Registrar registrar;

}  // namespace
}  // namespace torchtpu

// Every other operator passes through (PyTorch registers this for its own
// devices' autocast keys only).
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}
