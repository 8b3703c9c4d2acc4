// Operator registration for PrivateUse1: metadata-only kernels go straight to
// PyTorch's device-generic implementations (as OpenReg does), copies and
// scalars to the core, and every other operator through one boxed fallback
// that marshals its arguments and hands it to Rust.
#include "adapter.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_transformer_encoder_layer_fwd_native.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <unordered_map>

namespace torchtpu {

constexpr auto kTpu = c10::DeviceType::PrivateUse1;

TtTensor describe(const at::Tensor& t) {
  TtTensor d{};
  d.defined = t.defined();
  if (!t.defined()) return d;
  d.sizes = t.sizes().data();
  d.strides = t.strides().data();
  d.ndim = static_cast<int32_t>(t.dim());
  d.dtype = static_cast<int32_t>(t.scalar_type());
  d.offset = t.storage_offset();
  d.wrapped_number = t.unsafeGetTensorImpl()->is_wrapped_number();
  if (t.device().type() == kTpu) {
    d.device = t.device().index();
    d.storage = t.has_storage() ? t.storage().data_ptr().get_context() : nullptr;
  } else {
    TORCH_CHECK(t.is_cpu(), "Expected all tensors to be on the same device, but found at least "
                "two devices, tpu and ", t.device(), "!");
    d.device = -1;
    d.host = t.numel() ? t.const_data_ptr() : nullptr;
  }
  return d;
}

c10::Storage adopt_storage(const TtResult& r) {
  c10::Device device(kTpu, static_cast<c10::DeviceIndex>(r.device));
  c10::DataPtr data(reinterpret_cast<void*>(r.addr), r.storage, &tt_storage_release, device);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), r.nbytes, std::move(data), tpu_allocator(), true));
}

namespace {

void copy_on_device(const at::Tensor& src, const at::Tensor& dst) {
  auto s = describe(src), d = describe(dst);
  check(tt_copy(&s, &d));
}

// ---------------------------------------------------------------- the fallback

// What the adapter remembers of an operator, computed once.
struct OpEntry {
  int32_t op = -1;               // core op id, -1: CPU fallback
  std::vector<int> outs;         // argument indices of out= tensors
  std::vector<bool> generator;   // arguments of type Generator?
  std::vector<bool> tensor_list; // arguments of type Tensor[] or Tensor?[]
  std::vector<bool> scalar_type; // arguments of type ScalarType or ScalarType?
  bool inplace = false;          // self, one tensor, is written (add_, fill_, ...)
  std::vector<int> mutated;      // other written tensors and lists (running stats, an optimizer's): is_written
  bool checks_meta = false;      // the core checks what the meta function would (tt_op_checks_meta)
};

const OpEntry& register_op(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static std::unordered_map<const void*, std::unique_ptr<OpEntry>> table;
  const c10::FunctionSchema& schema = op.schema();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = table[&schema];
  if (slot) return *slot;
  slot = std::make_unique<OpEntry>();
  const auto& arguments = schema.arguments();
  auto written = [&](size_t i) { return arguments[i].alias_info() && arguments[i].alias_info()->isWrite(); };
  bool has_out = std::any_of(arguments.begin(), arguments.end(), [](const c10::Argument& a) { return a.is_out(); });
  std::vector<std::string> types;
  std::vector<TtSchemaArg> args;
  for (const auto& a : arguments) types.push_back(a.type()->str());
  // A written list self (_fused_adam_) is one of the mutated arguments.
  slot->inplace = !has_out && !arguments.empty() && written(0) && types[0] == "Tensor";
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto& a = arguments[i];
    bool is_out = a.is_out();
    if (is_out) slot->outs.push_back(static_cast<int>(i));
    slot->generator.push_back(types[i] == "Generator?");
    slot->tensor_list.push_back(types[i].rfind("Tensor", 0) == 0 && types[i].back() == ']');
    slot->scalar_type.push_back(types[i] == "ScalarType" || types[i] == "ScalarType?");
    bool other_written = written(i) && !is_out && !(slot->inplace && i == 0);
    args.push_back({a.name().c_str(), types[i].c_str(), is_out, other_written});
  }
  check(tt_op_register(schema.name().c_str(), schema.overload_name().c_str(), args.data(),
                       static_cast<int64_t>(args.size()), &slot->op));
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].is_written) slot->mutated.push_back(static_cast<int>(i));
  }
  slot->checks_meta = slot->op >= 0 && tt_op_checks_meta(slot->op);
  return *slot;
}

// Entries never move once made, so each thread keeps a lock-free view.
const OpEntry& op_entry(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const void*, const OpEntry*> seen;
  auto& entry = seen[&op.schema()];
  if (!entry) entry = &register_op(op);
  return *entry;
}

// Types XLA does not compute in (the core's `DType::is_storage_only`):
// their values only move; ops on them run on the CPU.
bool storage_only(at::ScalarType t) {
  switch (t) {
    case at::kComplexHalf:
    case at::kFloat8_e5m2:
    case at::kFloat8_e4m3fn:
    case at::kFloat8_e5m2fnuz:
    case at::kFloat8_e4m3fnuz:
      return true;
    default:
      return false;
  }
}

// Owns the marshalled form of one call's arguments (on the stack for a
// call of a few arguments: no allocation per op).
struct Marshal {
  c10::SmallVector<TtArg, 8> args;
  c10::SmallVector<TtTensor, 8> tensors;
  // Moving a vector keeps its buffer, so TtArgs may point into these.
  std::vector<std::vector<int64_t>> ints;
  std::vector<std::vector<double>> floats;
  // Arguments with a math bit, resolved: lowerings read stored values, and
  // the math-bit fallbacks let linear algebra (mm, dot, solve_triangular)
  // through with the bit set, as BLAS takes a conjugate operand.
  std::vector<at::Tensor> resolved;
  // A call the core cannot take runs on the CPU: XLA computes in neither
  // complex32 nor float8.
  bool on_cpu = false;

  void add(const OpEntry& entry, size_t i, const c10::IValue& v, c10::DeviceIndex device) {
    TtArg a{};
    if (entry.generator[i]) {
      a.kind = TT_ARG_SEED;
      a.i = static_cast<int64_t>(draw_seed(
          v.isNone() ? std::nullopt : std::optional<at::Generator>(v.toGenerator()), device));
    } else if (v.isNone()) {
      a.kind = TT_ARG_NONE;
    } else if (v.isTensor()) {
      a.kind = TT_ARG_TENSOR;
      a.len = 1;
      a.tensors = push(v.toTensor());
    } else if (v.isTensorList()) {
      a.kind = TT_ARG_TENSOR_LIST;
      auto list = v.toTensorList();
      a.len = static_cast<int64_t>(list.size());
      a.tensors = tensors.data() + tensors.size();
      for (const at::Tensor& t : list) push(t);
    } else if (v.isList() && entry.tensor_list[i]) {
      a.kind = TT_ARG_TENSOR_LIST;  // Tensor?[]
      auto list = v.toList();
      a.len = static_cast<int64_t>(list.size());
      a.tensors = tensors.data() + tensors.size();
      for (const c10::IValue& t : list) push(t.isNone() ? at::Tensor() : t.toTensor());
    } else if (v.isBool()) {
      a.kind = TT_ARG_BOOL;
      a.i = v.toBool();
    } else if (v.isInt() || v.isSymInt()) {
      a.kind = TT_ARG_INT;
      a.i = v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__);
      on_cpu |= entry.scalar_type[i] && storage_only(static_cast<at::ScalarType>(a.i));
    } else if (v.isDouble()) {
      a.kind = TT_ARG_FLOAT;
      a.f = v.toDouble();
    } else if (v.isIntList() || v.isSymIntList() || (v.isList() && v.toList().empty())) {
      a.kind = TT_ARG_INT_LIST;
      if (v.isIntList()) ints.push_back(v.toIntVector());
      else if (v.isSymIntList()) ints.push_back(c10::asIntArrayRefSlow(v.toSymIntVector(), __FILE__, __LINE__).vec());
      else ints.emplace_back();  // an empty list of numbers
      a.ints = ints.back().data();
      a.len = static_cast<int64_t>(ints.back().size());
    } else if (v.isBoolList()) {
      a.kind = TT_ARG_BOOL_LIST;
      auto list = v.toBoolList();
      ints.emplace_back(list.begin(), list.end());
      a.ints = ints.back().data();
      a.len = static_cast<int64_t>(ints.back().size());
    } else if (v.isDoubleList()) {
      a.kind = TT_ARG_FLOAT_LIST;
      floats.push_back(v.toDoubleVector());
      a.floats = floats.back().data();
      a.len = static_cast<int64_t>(floats.back().size());
    } else if (v.isString()) {
      a.kind = TT_ARG_STRING;
      a.str = v.toStringRef().c_str();
    } else if (v.isComplexDouble()) {
      auto z = v.toComplexDouble();
      a.kind = TT_ARG_COMPLEX;
      a.f = z.real();
      a.imag = z.imag();
    } else {
      a.kind = TT_ARG_OTHER;
    }
    args.push_back(a);
  }

  const TtTensor* push(const at::Tensor& t) {
    on_cpu |= t.defined() && storage_only(t.scalar_type());
    if (t.defined() && (t.is_conj() || t.is_neg())) {
      resolved.push_back(t.resolve_conj().resolve_neg());
      tensors.push_back(describe(resolved.back()));
      return &tensors.back();
    }
    tensors.push_back(describe(t));
    return &tensors.back();
  }
};

size_t count_tensors(c10::ArrayRef<c10::IValue> values) {
  size_t n = 0;
  for (const auto& v : values) {
    if (v.isTensor()) n += 1;
    else if (v.isList()) n += v.toList().size();
  }
  return n;
}

at::Tensor wrap(const TtResult& r) {
  if (!r.storage) return at::Tensor();
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      adopt_storage(r), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      caffe2::TypeMeta::fromScalarType(static_cast<at::ScalarType>(r.dtype)));
  if (r.strides) {
    t.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(r.sizes, r.ndim),
                                                   c10::IntArrayRef(r.strides, r.ndim));
  } else {
    t.unsafeGetTensorImpl()->set_sizes_contiguous(c10::IntArrayRef(r.sizes, r.ndim));
  }
  return t;
}

// Writes a functional result into a mutated argument, as PyTorch's out= rules say.
void write_into(const at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK(c10::canCast(src.scalar_type(), dst.scalar_type()), "result type ",
              src.scalar_type(), " can't be cast to the desired output type ", dst.scalar_type());
  at::native::resize_output(dst, src.sizes());
  copy_on_device(src, dst);
}

// A result that exactly fills dst's storage becomes its value directly; an
// undefined one leaves dst as it is.
void write_result(const at::Tensor& dst, const TtResult& r) {
  if (!r.storage) return;
  bool whole = dst.scalar_type() == static_cast<at::ScalarType>(r.dtype) && dst.has_storage() &&
               dst.sizes() == c10::IntArrayRef(r.sizes, r.ndim) && dst.storage_offset() == 0 &&
               (r.strides ? dst.strides() == c10::IntArrayRef(r.strides, r.ndim) : dst.is_contiguous()) &&
               static_cast<int64_t>(dst.storage().nbytes()) == r.nbytes &&
               dst.storage().data_ptr().get_context() != nullptr;
  if (!whole) return write_into(dst, wrap(r));
  int status = tt_storage_assign(dst.storage().data_ptr().get_context(), r.storage);
  tt_storage_release(r.storage);
  check(status);
}

at::Scalar local_scalar(const at::Tensor& self);

c10::IValue to_return(const c10::Argument& ret, c10::SmallVectorImpl<at::Tensor>& results, size_t& next) {
  const auto& type = ret.type();
  if (type->kind() == c10::TypeKind::TensorType) return results.at(next++);
  if (type->kind() == c10::TypeKind::ListType) {
    std::vector<at::Tensor> rest(results.begin() + static_cast<std::ptrdiff_t>(next), results.end());
    next = results.size();
    return rest;
  }
  at::Scalar s = local_scalar(results.at(next++));
  switch (type->kind()) {
    case c10::TypeKind::BoolType: return s.toBool();
    case c10::TypeKind::IntType: return s.toLong();
    case c10::TypeKind::FloatType: return s.toDouble();
    default: return s;
  }
}

// Runs the call on CPU, counted by the core as a fallback of `op`.
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check(tt_fallback(c10::toString(op.operator_name()).c_str()));
  at::native::cpu_fallback(op, stack);
}

// TensorIterator's rules for the tensors an op writes: no element written
// twice, no input partly overlapping them.
void check_overlap(const OpEntry& entry, c10::ArrayRef<c10::IValue> inputs) {
  auto check = [&](size_t w) {
    const at::Tensor& dst = inputs[w].toTensor();
    at::assert_no_internal_overlap(dst);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (i != w && inputs[i].isTensor() && inputs[i].toTensor().defined()) {
        at::assert_no_partial_overlap(dst, inputs[i].toTensor());
      }
    }
  };
  for (int w : entry.outs) check(static_cast<size_t>(w));
  if (entry.outs.empty() && entry.inplace) check(0);
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpEntry& entry = op_entry(op);
  if (entry.op < 0) return run_on_cpu(op, stack);
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto inputs = torch::jit::last(*stack, n);
  c10::DeviceIndex device = -1;
  for (const auto& v : inputs) {
    if (v.isTensor() && v.toTensor().device().type() == kTpu) {
      device = v.toTensor().device().index();
      break;
    }
  }
  const c10::DeviceGuard guard(c10::Device(kTpu, device < 0 ? 0 : device));
  Marshal m;
  m.tensors.reserve(count_tensors(inputs));
  m.args.reserve(n);
  for (size_t i = 0; i < n; ++i) m.add(entry, i, inputs[i], device);
  if (m.on_cpu) return run_on_cpu(op, stack);
  if (entry.checks_meta) check_overlap(entry, inputs);
  const TtResult* raw = nullptr;
  int64_t count = 0;
  const int status = tt_op_run(entry.op, m.args.data(), static_cast<int64_t>(n), &raw, &count);
  // A call the lowering does not cover (complex operands).
  if (status == TT_FALLBACK) return run_on_cpu(op, stack);
  check(status);
  // Owns the result handles until they are wrapped or assigned.
  struct Results {
    c10::SmallVector<TtResult, 4> list;
    size_t taken = 0;
    ~Results() {
      for (size_t k = taken; k < list.size(); ++k) tt_storage_release(list[k].storage);
    }
  } results{{raw, raw + count}};

  // Mutated arguments besides out= and self take the last results, one per
  // defined tensor, a list's in order (an absent Tensor? may arrive as None
  // or undefined).
  for (auto i = entry.mutated.rbegin(); i != entry.mutated.rend(); ++i) {
    std::vector<at::Tensor> targets;
    if (inputs[*i].isTensor()) targets.push_back(inputs[*i].toTensor());
    else if (inputs[*i].isTensorList()) targets = inputs[*i].toTensorVector();
    for (auto t = targets.rbegin(); t != targets.rend(); ++t) {
      if (!t->defined()) continue;
      TORCH_CHECK(results.list.size() > results.taken, "torchtpu: ", schema.name(), " returned too few results");
      TtResult r = results.list.back();
      results.list.pop_back();  // write_result owns it now
      write_result(*t, r);
    }
  }

  // Mutated arguments (out= or self) receive the results and are returned.
  c10::SmallVector<int, 4> written(entry.outs.begin(), entry.outs.end());
  if (written.empty() && entry.inplace) written.push_back(0);
  if (!written.empty()) {
    c10::SmallVector<c10::IValue, 4> returns;
    TORCH_CHECK(results.list.size() >= written.size(), "torchtpu: ", schema.name(), " returned too few results");
    for (size_t k = 0; k < written.size(); ++k) {
      // An output that is also an input (in-place, or out= aliasing an
      // input) cannot be resized to the broadcast shape.
      const auto& dst = inputs[written[k]].toTensor();
      if (!results.list[k].storage) continue;
      c10::IntArrayRef shape(results.list[k].sizes, results.list[k].ndim);
      bool aliased = entry.outs.empty() || std::any_of(inputs.begin(), inputs.end(), [&](const c10::IValue& v) {
        return &v != &inputs[written[k]] && v.isTensor() && v.toTensor().is_same(dst);
      });
      TORCH_CHECK(!aliased || dst.sizes() == shape, "output with shape ", dst.sizes(),
                  " doesn't match the broadcast shape ", shape);
    }
    for (size_t k = 0; k < written.size(); ++k) {
      results.taken = k + 1;
      write_result(inputs[written[k]].toTensor(), results.list[k]);
      returns.push_back(inputs[written[k]]);
    }
    torch::jit::drop(*stack, n);
    for (auto& r : returns) stack->push_back(std::move(r));
    return;
  }
  c10::SmallVector<at::Tensor, 4> tensors;
  tensors.reserve(results.list.size());
  for (const auto& r : results.list) {
    ++results.taken;
    tensors.push_back(wrap(r));
  }
  torch::jit::drop(*stack, n);
  size_t next = 0;
  for (const auto& ret : schema.returns()) stack->push_back(to_return(ret, tensors, next));
}

// ---------------------------------------------------------------- direct kernels

at::Tensor empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                 std::optional<at::Layout> layout, std::optional<at::Device> device,
                 std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "tpu supports only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, tpu_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "tpu supports only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, tpu_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

// Grows the storage of `self` if its view no longer fits in it.
void fit_storage(const at::Tensor& self) {
  auto* impl = self.unsafeGetTensorImpl();
  size_t nbytes = at::detail::computeStorageNbytes(impl->sizes(), impl->strides(), self.itemsize(),
                                                   impl->storage_offset());
  if (nbytes > impl->storage().nbytes()) resize_storage(impl->storage(), nbytes);
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  if (impl->sizes() == sizes && !memory_format) return self;
  impl->set_sizes_contiguous(sizes);
  if (memory_format) impl->empty_tensor_restride(*memory_format);
  fit_storage(self);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, c10::SymInt offset,
                        c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  auto off = offset.guard_int(__FILE__, __LINE__);
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  auto strides = C10_AS_INTARRAYREF_SLOW(stride);
  at::native::checkSetStorage(self, source, off, sizes, strides);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  if (strides.data()) impl->set_sizes_and_strides(sizes, strides, off);
  else {
    impl->set_sizes_contiguous(sizes);
    impl->set_storage_offset(off);
  }
  fit_storage(self);
  return self;
}

at::Tensor& set_source(at::Tensor& self, at::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes()) / static_cast<int64_t>(self.itemsize());
  return set_storage(self, std::move(source), 0, c10::SymIntArrayRef({c10::SymInt(n)}), {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& src) {
  return at::native::set_tensor_(self, src);
}

at::Tensor& set_empty(at::Tensor& self) {
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 0,
                                                       tpu_allocator(), true);
  return set_storage(self, c10::Storage(std::move(storage)), 0, c10::SymIntArrayRef({c10::SymInt(0)}), {});
}

// `t` without its math bits (conjugate, negative): the values its storage holds.
at::Tensor stored(const at::Tensor& t) {
  auto s = t.is_conj() ? t.conj() : t;  // conj() of a conjugate view clears the bit
  return s.is_neg() ? at::_neg_view(s) : s;
}

// Math bits are views' business: a copy moves stored values, then makes dst's
// stored values read, through dst's bits, as self's values do through self's.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  if (dst.numel() == 0) return dst;
  if (self.is_privateuseone() && dst.is_privateuseone()) {
    // XLA computes in neither complex32 nor float8: a conversion to or from
    // them runs on the CPU.
    bool on_cpu = self.scalar_type() != dst.scalar_type() &&
                  (storage_only(self.scalar_type()) || storage_only(dst.scalar_type()));
    if (self.device() == dst.device() && !on_cpu) {
      copy_on_device(self, dst);
      auto raw = stored(dst);
      if (self.is_conj() != dst.is_conj() && dst.is_complex()) raw.conj_physical_();
      if (self.is_neg() != dst.is_neg()) raw.neg_();
      return dst;
    }
    if (on_cpu) check(tt_fallback("aten::_copy_from"));
    return copy_from(self.cpu(), dst, false);  // through the host
  }
  if (dst.is_privateuseone()) {
    // The core receives host data already in dst's dtype and shape.
    auto src = self.resolve_conj().resolve_neg().to(dst.scalar_type());
    if (dst.is_conj()) src = src.conj();
    if (dst.is_neg()) src = at::_neg_view(src);
    copy_on_device(src.resolve_conj().resolve_neg().expand(dst.sizes()).contiguous(), dst);
    return dst;
  }
  auto tmp = at::empty(self.sizes(), self.options().device(c10::kCPU));
  copy_on_device(self, tmp);
  if (self.is_conj()) tmp = tmp.conj();
  if (self.is_neg()) tmp = at::_neg_view(tmp);
  dst.copy_(tmp);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar(const at::Tensor& self) {
  auto tmp = at::empty({}, self.options().device(c10::kCPU));
  copy_on_device(self.reshape({}), tmp);
  return tmp.item();
}

// `param.data = t` and nn.Module._apply swap a tensor's contents in place
// only between "compatible" tensors; c10's rule lists the in-tree dense
// backends, so without this CPU<->tpu moves built new Parameters and untied
// shared ones (tied embeddings). A dense tpu tensor is compatible with any
// dense tensor, as a CUDA one is.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  // Dense on tpu, or on a backend c10 counts as dense (compatible with CPU).
  static const c10::DispatchKeySet dense_cpu(c10::DispatchKey::CPU);
  auto dense = [](const at::Tensor& t) {
    return (t.is_privateuseone() && t.layout() == at::kStrided) ||
           t.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(dense_cpu);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense(self) && dense(from));
}

// CUDA's caching allocator must not reuse a block until the streams that use
// it are done. Ours never reuses memory: a PJRT buffer outlives the programs
// reading it, so recording a stream only checks that it is a tpu stream.
void record_stream(at::Tensor& /*self*/, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kTpu, "record_stream expects a tpu stream, got ", stream);
}

}  // namespace
}  // namespace torchtpu

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace torchtpu;
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("empty.memory_format", TORCH_FN(empty));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("resize_", TORCH_FN(resize));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_.source_Storage", TORCH_FN(set_source));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar));
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torchtpu::fallback>());
}

// Operators whose composite kernels would win over the fallback: the
// convolution hooks for out-of-tree backends (their defaults throw), norms
// PyTorch otherwise decomposes (layer_norm into batch_norm), mode, whose
// composite kernel accepts only CPU, CUDA and XPU tensors, conj_physical_
// and kaiser_window, whose composite kernels call a kernel stub directly
// (no stub has a PrivateUse1 kernel: PyTorch's assert), and
// silu_backward and mish_backward, whose composites round each step to
// bfloat16 where CPU's kernels compute in float, and _grouped_mm, whose composite reads the
// groups' offsets on the host and so compiles a program per routing
// (test_device checks no other lowering is hidden).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"convolution_overrideable", "convolution_backward_overrideable", "native_layer_norm",
                           "native_group_norm", "mode", "mode.values", "conj_physical_", "silu_backward",
                           "mish_backward", "_grouped_mm", "kaiser_window",
                           "kaiser_window.periodic", "kaiser_window.beta"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&torchtpu::fallback>());
  }
}

// Structured operators' functional and in-place forms (add, add_, mul, ...):
// their CompositeExplicitAutogradNonFunctional kernel runs the meta function
// (a TensorIterator), makes an out tensor and calls the out= form, whose
// result the fallback then writes back: more than the core's whole op. Where
// the lowering checks what the meta function does, they come to the fallback
// directly.
const struct StructuredForms {
  torch::Library lib{torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__};

  StructuredForms() {
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const auto& name :
         dispatcher.getAllOpNamesForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      auto op = dispatcher.findOp(name);
      if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) || !torchtpu::op_entry(*op).checks_meta) {
        continue;
      }
      std::string unqualified = name.name.substr(name.name.find("::") + 2);
      if (!name.overload_name.empty()) unqualified += "." + name.overload_name;
      lib.impl(unqualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&torchtpu::fallback>());
    }
  }
} structured_forms;

// nn.TransformerEncoderLayer's fast path in eval mode: PyTorch's kernel is
// composed of ATen ops (layer_norm, _native_multi_head_attention, linear) but
// registered for CPU and CUDA only.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_transformer_encoder_layer_fwd", TORCH_FN(at::native::transformer_encoder_layer_forward));
}

// Conjugate/negative views are resolved inside _copy_from; without these the
// math-bit fallbacks recurse through it forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}
