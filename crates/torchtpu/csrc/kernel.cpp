// The fast Python entry of custom kernels (torchtpu.pallas). A call whose
// arguments are tpu tensors of a signature already lowered goes from Python
// straight to the operator torchtpu::kernel, for what a native op costs;
// anything else (a first signature, gradients, numbers, other devices) is
// left to the Python path, which lowers the kernel and records the signature.
#include "adapter.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchtpu {
namespace {

constexpr auto kTpu = c10::DeviceType::PrivateUse1;

// Per decorated kernel: signature -> id of its lowering. Used with the GIL held.
using Table = std::unordered_map<std::string, int64_t>;
std::vector<std::unique_ptr<Table>> tables;

// The signature of `args` (dtype and sizes of each), if every one is a tpu
// tensor that needs no gradient here; their tensors into `tensors`.
bool signature(PyObject* args, std::string& key, std::vector<at::Tensor>& tensors) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  const bool grad = c10::GradMode::is_enabled();
  tensors.reserve(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* arg = PyTuple_GET_ITEM(args, i);
    if (!THPVariable_Check(arg)) return false;
    const at::Tensor& t = THPVariable_Unpack(arg);
    if (t.device().type() != kTpu || (grad && t.requires_grad())) return false;
    key.push_back(static_cast<char>(t.scalar_type()));
    key.push_back(static_cast<char>(t.dim()));
    key.append(reinterpret_cast<const char*>(t.sizes().data()), t.dim() * sizeof(int64_t));
    tensors.push_back(t);
  }
  return true;
}

Table* table_at(int64_t table) {
  return table >= 0 && table < static_cast<int64_t>(tables.size()) ? tables[table].get() : nullptr;
}

}  // namespace
}  // namespace torchtpu

using torchtpu::tables;

extern "C" int64_t tt_kernel_table_new(void) {
  tables.push_back(std::make_unique<torchtpu::Table>());
  return static_cast<int64_t>(tables.size()) - 1;
}

extern "C" void tt_kernel_table_put(int64_t table, void* args, int64_t kernel) {
  torchtpu::Table* t = torchtpu::table_at(table);
  std::string key;
  std::vector<at::Tensor> tensors;
  if (t != nullptr && torchtpu::signature(static_cast<PyObject*>(args), key, tensors)) (*t)[key] = kernel;
}

extern "C" void* tt_kernel_table_call(int64_t table, void* args) {
  HANDLE_TH_ERRORS
  torchtpu::Table* t = torchtpu::table_at(table);
  std::string key;
  std::vector<at::Tensor> tensors;
  if (t == nullptr || !torchtpu::signature(static_cast<PyObject*>(args), key, tensors)) return nullptr;
  const auto found = t->find(key);
  if (found == t->end()) return nullptr;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torchtpu::kernel", "")
                             .typed<std::vector<at::Tensor>(int64_t, at::TensorList)>();
  std::vector<at::Tensor> outputs;
  {
    pybind11::gil_scoped_release no_gil;
    // No input needs a gradient here (`signature` checked): autograd has nothing to record.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    outputs = op.call(found->second, tensors);
  }
  return THPVariable_Wrap(std::move(outputs.at(0)));
  END_HANDLE_TH_ERRORS
}
