// Sparse COO tensors on tpu: PyTorch's SparseTensorImpl over tpu indices
// and values. nn.Embedding(sparse=True) and EmbeddingBag's gradients are
// sparse; optimizers (SGD, SparseAdam, Adagrad) apply them with add_,
// coalesce and sparse_mask, and graph networks multiply a sparse adjacency
// by dense features. PyTorch registers its sparse kernels per backend
// (SparseCPU, SparseCUDA), none for PrivateUse1.
//
// Three kinds of kernels:
// - PyTorch's own where it registers one function for CPU and CUDA: those
//   only rearrange metadata or call ATen ops on indices and values, so they
//   run as they are on tpu tensors (the values' ops are lowered as usual).
// - Ours where CPU's and CUDA's kernels differ (loops over host memory,
//   thrust): the common cases written in dense tpu ops, as CUDA does
//   (add concatenates, coalesce sorts), so a table's update costs its
//   nonzeros, not a copy of the table.
// - Everything else, and cases ours leave out, runs PyTorch's sparse CPU
//   kernel through the counted fallback, which also raises CPU's errors.
// Compressed layouts (CSR, CSC, BSR, BSC) keep their metadata on tpu and
// compute on the CPU, counted.
#include "adapter.h"

#include <ATen/ATen.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/SparseTensorUtils.h>
#include <ATen/ops/_embedding_bag_backward_native.h>
#include <ATen/ops/_to_sparse_native.h>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

#include <utility>
#include <vector>

namespace torchtpu {
namespace {

using c10::DispatchKey::SparseCPU;
using c10::DispatchKey::SparseCsrCPU;

template <c10::DispatchKey cpu>
void on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check(tt_fallback(c10::toString(op.operator_name()).c_str()));
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true, cpu);
}

template <c10::DispatchKey cpu>
void generic(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(cpu), stack);
}

// A kernel that computes the cases it takes on the device and returns true,
// else leaves the stack to CPU's kernel.
using Kernel = bool (*)(torch::jit::Stack*);

template <Kernel kernel>
void on_device_or_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!kernel(stack)) on_cpu<SparseCPU>(op, stack);
}

const c10::IValue& arg(torch::jit::Stack* stack, size_t i, size_t n) { return torch::jit::peek(*stack, i, n); }

template <typename Result>
bool returns(torch::jit::Stack* stack, size_t n, Result result) {
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(result));
  return true;
}

// `out` made a sparse tensor of `sizes` over `indices` and `values`.
void set_sparse(const at::Tensor& out, c10::IntArrayRef sizes, const at::Tensor& indices, const at::Tensor& values,
                bool coalesced) {
  at::sparse::get_sparse_impl(out)->resize_(indices.size(0), values.dim() - 1, sizes);
  at::sparse::alias_into_sparse(out, indices, values.to(out.scalar_type()));
  out._coalesced_(coalesced);
}

// Advanced indexing by a sparse tensor's indices: its sparse dimensions.
c10::List<std::optional<at::Tensor>> index_by(const at::Tensor& indices) {
  c10::List<std::optional<at::Tensor>> list;
  for (const auto& row : indices.unbind(0)) list.push_back(row);
  return list;
}

// add.out: dense + sparse into a dense out (one scatter-add of the nonzeros),
// sparse + sparse by concatenation, uncoalesced (as CUDA).
bool add_out(torch::jit::Stack* stack) {
  const auto& self = arg(stack, 0, 4).toTensor();
  const auto& other = arg(stack, 1, 4).toTensor();
  const auto alpha = arg(stack, 2, 4).toScalar();
  auto out = arg(stack, 3, 4).toTensor();
  const auto dtype = at::result_type(self, other);
  if (!other.is_sparse() || self.sizes() != other.sizes() || self.is_sparse() != out.is_sparse() ||
      !at::canCast(dtype, out.scalar_type()) || other.sparse_dim() == 0 || at::isComplexType(dtype)) {
    return false;
  }
  const auto values = at::mul(other._values().to(dtype), alpha);
  if (self.is_sparse()) {
    if (self.sparse_dim() != other.sparse_dim()) return false;
    auto indices = at::cat({self._indices(), other._indices()}, 1);
    set_sparse(out, self.sizes(), indices, at::cat({self._values().to(dtype), values}, 0), false);
    return returns(stack, 4, out);
  }
  if (!out.is_same(self)) out.resize_(self.sizes()).copy_(self);
  out.index_put_(index_by(other._indices()), values.to(out.scalar_type()), /*accumulate=*/true);
  return returns(stack, 4, out);
}

// mul.out of a sparse tensor by a dense scalar or a dense tensor of its
// size: the dense factor read at the nonzeros.
bool mul_out(torch::jit::Stack* stack) {
  const auto& self = arg(stack, 0, 3).toTensor();
  const auto& other = arg(stack, 1, 3).toTensor();
  auto out = arg(stack, 2, 3).toTensor();
  if (self.is_sparse() == other.is_sparse() || !out.is_sparse()) return false;
  const auto& sparse = self.is_sparse() ? self : other;
  const auto& dense = self.is_sparse() ? other : self;
  const auto dtype = at::result_type(self, other);
  if ((dense.dim() != 0 && dense.sizes() != sparse.sizes()) || !at::canCast(dtype, out.scalar_type())) return false;
  const auto factor = dense.dim() == 0 ? dense : at::index(dense, index_by(sparse._indices()));
  set_sparse(out, sparse.sizes(), sparse._indices().clone(), at::mul(sparse._values(), factor).to(dtype),
             sparse.is_coalesced());
  return returns(stack, 3, out);
}

// _coalesce: indices sorted and made unique, duplicates' values summed.
bool coalesce(torch::jit::Stack* stack) {
  const auto& self = arg(stack, 0, 1).toTensor();
  const auto sparse_dim = self.sparse_dim();
  if (self._nnz() < 2 || sparse_dim == 0) {
    auto copy = self.clone();
    copy._coalesced_(true);
    return returns(stack, 1, copy);
  }
  auto sizes = self.sizes().slice(0, sparse_dim);
  // Row-major positions (PyTorch's flatten_indices is a CPU/CUDA kernel stub).
  const auto indices = self._indices();
  auto flat = indices[0];
  for (int64_t d = 1; d < sparse_dim; ++d) flat = at::add(at::mul(flat, sizes[d]), indices[d]);
  auto [unique, inverse, counts] = at::_unique2(flat, /*sorted=*/true, /*return_inverse=*/true);
  auto values_sizes = self._values().sizes().vec();
  values_sizes[0] = unique.size(0);
  const auto values = at::zeros(values_sizes, self._values().options()).index_add_(0, inverse, self._values());
  std::vector<at::Tensor> rows(sparse_dim);
  for (int64_t d = sparse_dim - 1; d >= 0; --d) {
    rows[d] = at::remainder(unique, sizes[d]);
    unique = at::div(unique, sizes[d], "floor");
  }
  auto result = at::empty({0}, self.options());
  set_sparse(result, self.sizes(), at::stack(rows), values, true);
  return returns(stack, 1, result);
}

// sparse_mask of a dense tensor: its elements at the mask's indices.
bool sparse_mask(torch::jit::Stack* stack) {
  const auto& self = arg(stack, 0, 2).toTensor();
  const auto& mask = arg(stack, 1, 2).toTensor();
  if (self.is_sparse() || !mask.is_sparse() || self.sizes() != mask.sizes() || mask._nnz() == 0 ||
      mask.sparse_dim() == 0) {
    return false;
  }
  auto result = at::empty({0}, mask.options().dtype(self.scalar_type()));
  set_sparse(result, self.sizes(), mask._indices().clone(), at::index(self, index_by(mask._indices())),
             mask.is_coalesced());
  return returns(stack, 2, result);
}

// A sparse matrix times a dense one: each nonzero's row of `dense`, scaled,
// added into its output row.
std::optional<at::Tensor> sparse_times_dense(const at::Tensor& sparse, const at::Tensor& dense) {
  if (!sparse.is_sparse() || dense.is_sparse() || sparse.sparse_dim() != 2 || sparse.dense_dim() != 0 ||
      dense.dim() != 2 || dense.size(0) != sparse.size(1) || sparse.scalar_type() != dense.scalar_type()) {
    return std::nullopt;
  }
  const auto indices = sparse._indices();
  const auto rows = at::mul(at::index_select(dense, 0, indices[1]), sparse._values().unsqueeze(1));
  return at::zeros({sparse.size(0), dense.size(1)}, dense.options()).index_add_(0, indices[0], rows);
}

// beta self + alpha (sparse @ dense), self of the product's size (or
// broadcast to it where `expand`).
std::optional<at::Tensor> addmm(const at::Tensor& self, const at::Tensor& sparse, const at::Tensor& dense,
                                const at::Scalar& beta, const at::Scalar& alpha, bool expand) {
  auto product = sparse_times_dense(sparse, dense);
  if (!product || self.is_sparse() || self.scalar_type() != dense.scalar_type()) return std::nullopt;
  const auto sizes = product->sizes();
  if (expand ? !at::is_expandable_to(self.sizes(), sizes) : self.sizes() != sizes) return std::nullopt;
  auto scaled = at::mul(*product, alpha);
  if (beta.toComplexDouble() == 0.0) return scaled;
  return at::add(scaled, at::mul(self.expand(sizes), beta));
}

bool addmm_functional(torch::jit::Stack* stack) {
  auto r = addmm(arg(stack, 0, 5).toTensor(), arg(stack, 1, 5).toTensor(), arg(stack, 2, 5).toTensor(),
                 arg(stack, 3, 5).toScalar(), arg(stack, 4, 5).toScalar(), true);
  return r && returns(stack, 5, *r);
}

bool addmm_out(torch::jit::Stack* stack) {
  auto out = arg(stack, 5, 6).toTensor();
  auto r = addmm(arg(stack, 0, 6).toTensor(), arg(stack, 1, 6).toTensor(), arg(stack, 2, 6).toTensor(),
                 arg(stack, 3, 6).toScalar(), arg(stack, 4, 6).toScalar(), true);
  if (!r || out.is_sparse() || out.scalar_type() != r->scalar_type()) return false;
  out.resize_(r->sizes()).copy_(*r);
  return returns(stack, 6, out);
}

bool addmm_inplace(torch::jit::Stack* stack) {
  auto self = arg(stack, 0, 5).toTensor();
  auto r = addmm(self, arg(stack, 1, 5).toTensor(), arg(stack, 2, 5).toTensor(), arg(stack, 3, 5).toScalar(),
                 arg(stack, 4, 5).toScalar(), false);
  if (!r) return false;
  self.copy_(*r);
  return returns(stack, 5, self);
}

// A c10d collective of sparse tensors (DDP's all-reduce of sparse
// gradients) runs in gloo on CPU copies, counted. Its Work finishes, and
// writes the copies, on gloo's thread: the results are copied back once it
// has, where the fallback would copy them back when the call returns and
// read copies half written (indices of one nnz, values of another).
void collective_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check(tt_fallback(c10::toString(op.operator_name()).c_str()));
  std::vector<std::pair<at::Tensor, at::Tensor>> moved;  // (tpu tensor, its CPU copy)
  auto to_cpu = [&](const at::Tensor& t) {
    if (!t.defined() || !t.is_privateuseone()) return t;
    moved.emplace_back(t, t.cpu());
    return moved.back().second;
  };
  // The tensors among the last `n` values of the stack, mapped by `f`.
  auto map_last = [&](size_t n, auto f) {
    for (size_t i = stack->size() - n; i < stack->size(); ++i) {
      auto& v = (*stack)[i];
      if (v.isTensor()) {
        v = f(v.toTensor());
      } else if (v.isTensorList()) {
        std::vector<at::Tensor> list;
        for (const at::Tensor& t : v.toTensorVector()) list.push_back(f(t));
        v = c10::IValue(list);
      }
    }
  };
  map_last(op.schema().arguments().size(), to_cpu);
  op.callBoxed(stack);
  auto on_tpu = [&](const at::Tensor& t) {
    for (const auto& [tpu, cpu] : moved) {
      if (t.is_same(cpu)) return tpu;
    }
    return t;
  };
  const size_t returns = op.schema().returns().size();
  for (const auto& r : torch::jit::last(*stack, returns)) {
    if (r.isCustomClass()) r.toCustomClass<c10d::Work>()->wait();
  }
  for (const auto& [tpu, cpu] : moved) tpu.copy_(cpu);
  map_last(returns, on_tpu);
}

// The fallback's copy back into a sparse argument it mutated.
at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) { return dst.copy_(self); }

}  // namespace
}  // namespace torchtpu

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  using namespace torchtpu;
  m.impl("add.out", torch::CppFunction::makeFromBoxedFunction<&on_device_or_cpu<&add_out>>());
  m.impl("mul.out", torch::CppFunction::makeFromBoxedFunction<&on_device_or_cpu<&mul_out>>());
  m.impl("_coalesce", torch::CppFunction::makeFromBoxedFunction<&on_device_or_cpu<&coalesce>>());
  m.impl("sparse_mask", torch::CppFunction::makeFromBoxedFunction<&on_device_or_cpu<&sparse_mask>>());
  m.impl("addmm", torch::CppFunction::makeFromBoxedFunction<&on_device_or_cpu<&addmm_functional>>());
  m.impl("addmm.out", torch::CppFunction::makeFromBoxedFunction<&on_device_or_cpu<&addmm_out>>());
  m.impl("addmm_", torch::CppFunction::makeFromBoxedFunction<&on_device_or_cpu<&addmm_inplace>>());
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  // PyTorch's kernels shared by CPU and CUDA (see above).
  for (const char* name : {
           "_sparse_coo_tensor_with_dims", "_sparse_coo_tensor_with_dims_and_tensors", "_indices", "_values",
           "indices", "values", "_nnz", "sparse_dim", "dense_dim", "_dimI", "_dimV", "is_coalesced", "_coalesced_",
           "clone", "copy_", "copy_sparse_to_sparse_", "empty.memory_format", "empty_like", "sparse_resize_",
           "sparse_resize_and_clear_", "resize_as_sparse_", "zero_", "_to_dense", "add.Tensor", "add_.Tensor",
           "sub.Tensor", "sub_.Tensor", "sub.out", "mul.Tensor", "mul_.Tensor", "div.Tensor", "div_.Tensor",
           "div.out", "div.Tensor_mode", "div_.Tensor_mode", "div.out_mode", "neg", "neg_", "neg.out", "mm",
           "mm.out", "mv", "sum", "sum.dim_IntList", "unsqueeze", "permute", "pow.Tensor_Scalar",
           "pow.Tensor_Scalar_out", "sqrt", "sqrt_", "sqrt.out", "abs", "abs_", "abs.out", "sign", "sign_",
           "sign.out", "sgn", "sgn_", "sgn.out", "tanh", "tanh_", "tanh.out", "relu", "relu_", "isnan", "isinf",
           "nan_to_num", "nan_to_num_", "nan_to_num.out"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&generic<SparseCPU>>());
  }
}

TORCH_LIBRARY_IMPL(c10d, SparsePrivateUse1, m) {
  m.impl("allreduce_", torch::CppFunction::makeFromBoxedFunction<&torchtpu::collective_on_cpu>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torchtpu::on_cpu<torchtpu::SparseCPU>>());
}

// Compressed layouts (CSR, CSC, BSR, BSC): their metadata and moves by
// PyTorch's shared kernels, every op by CPU's (counted).
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  using namespace torchtpu;
  for (const char* name : {"crow_indices", "col_indices", "ccol_indices", "row_indices", "values", "_nnz",
                           "sparse_dim", "dense_dim", "clone", "copy_", "empty_like", "empty.memory_format",
                           "resize_as_sparse_"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&generic<SparseCsrCPU>>());
  }
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torchtpu::on_cpu<torchtpu::SparseCsrCPU>>());
}

// Dense operators with sparse results, by PyTorch's kernels that CPU and CUDA
// share: EmbeddingBag's backward (finds each index's bag where the forward
// left it out, then builds the sparse gradient from ATen ops or calls the
// lowered _embedding_bag_dense_backward) and to_sparse (nonzero, a gather).
constexpr at::Tensor (*dense_to_sparse)(const at::Tensor&, int64_t) = &at::native::dense_to_sparse;
constexpr at::Tensor (*dense_to_layout)(const at::Tensor&, std::optional<at::Layout>, at::OptionalIntArrayRef,
                                        std::optional<int64_t>) = &at::native::dense_to_sparse;

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_embedding_bag_backward", TORCH_FN(at::native::_embedding_bag_backward_symint));
  m.impl("_to_sparse.sparse_dim", TORCH_FN(dense_to_sparse));
  m.impl("_to_sparse", TORCH_FN(dense_to_layout));
}

// Operators with a sparse CPU kernel and none above would reach a composite
// kernel rather than the fallbacks (a structured op's functional form runs
// TensorIterator, which rejects sparse layouts): each gets CPU's kernel,
// counted. Defined last, so that the registrations above are seen.
template <c10::DispatchKey ours, c10::DispatchKey cpu>
struct CpuKernels {
  torch::Library lib{torch::Library::IMPL, "aten", ours, __FILE__, __LINE__};

  CpuKernels() {
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const auto& name : dispatcher.getAllOpNamesForDispatchKey(cpu)) {
      auto op = dispatcher.findOp(name);
      if (!op || op->hasKernelForDispatchKey(ours) || !name.name.starts_with("aten::")) continue;
      std::string unqualified = name.name.substr(6);
      if (!name.overload_name.empty()) unqualified += "." + name.overload_name;
      lib.impl(unqualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&torchtpu::on_cpu<cpu>>());
    }
  }
};

const CpuKernels<c10::DispatchKey::SparsePrivateUse1, c10::DispatchKey::SparseCPU> coo_on_cpu;
const CpuKernels<c10::DispatchKey::SparseCsrPrivateUse1, c10::DispatchKey::SparseCsrCPU> compressed_on_cpu;
