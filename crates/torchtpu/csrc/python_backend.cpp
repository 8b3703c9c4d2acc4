// A c10d Backend whose collectives are a Python object's methods, for
// torch before 2.15. Those versions give Python subclasses of c10d's Backend
// no constructor, so torchtpu.distributed's backend (a plain Python object
// there) is carried by this one: c10d dispatches a tpu tensor's collective to
// the group's backend for its device, which calls the object's method of the
// same name (2.15's names where 2.11's differ: `_allgather_base` is
// `all_gather_single`, ...), as torch 2.15's own Python trampoline does.
#include <torch/headeronly/version.h>

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 15

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <utility>

namespace {

namespace py = pybind11;

// The Work a Python method returned, kept alive with its Python object:
// the object's overrides (`wait`, `get_future`) live on it.
class PythonWork : public c10d::Work {
 public:
  explicit PythonWork(py::object work) : work_(work.cast<c10::intrusive_ptr<c10d::Work>>()), object_(std::move(work)) {}

  ~PythonWork() override {
    py::gil_scoped_acquire gil;
    object_ = py::object();
  }

  bool wait(std::chrono::milliseconds timeout) override {
    return work_->wait(timeout);
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return work_->getFuture();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  py::object object_;
};

class PythonBackend : public c10d::Backend {
 public:
  PythonBackend(py::object impl, int rank, int size) : Backend(rank, size), impl_(std::move(impl)) {}

  ~PythonBackend() override {
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }

  const py::object& impl() const {
    return impl_;
  }

  const std::string getBackendName() const override {
    py::gil_scoped_acquire gil;
    return impl_.attr("getBackendName")().cast<std::string>();
  }

  c10::intrusive_ptr<Options> getBackendOptions() override {
    py::gil_scoped_acquire gil;
    return impl_.attr("options").cast<c10::intrusive_ptr<Options>>();
  }

  // No splitting here: these versions' split_group splits CUDA groups only,
  // and ask a backend that could split for NCCL's no-color split, which their
  // Python binding lacks (a rank left out of new_group would fail).
  bool supportsSplitting() const override {
    return false;
  }

  bool supportsCoalescing() const override {
    py::gil_scoped_acquire gil;
    return impl_.attr("supports_coalescing").cast<bool>();
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return call("broadcast", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return call("allreduce", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    return call("allreduce_coalesced", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    return call("reduce", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    return call("allgather", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    return call("all_gather_single", output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    return call("all_gather_single_coalesced", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override {
    return call("gather", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    return call("scatter", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    return call("reduce_scatter", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    return call("reduce_scatter_single", output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    return call("reduce_scatter_single_coalesced", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    return call("all_to_all_single", output, input, output_splits, input_splits, opts);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    return call("alltoall", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return call("barrier", opts);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return call("send", tensors, dst, tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return call("recv", tensors, src, tag);
  }

 private:
  // A Python error raised here reaches the caller as itself: pybind restores
  // it where the collective was called from Python.
  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> call(const char* method, Args&&... args) {
    py::gil_scoped_acquire gil;
    return c10::make_intrusive<PythonWork>(impl_.attr(method)(std::forward<Args>(args)...));
  }

  py::object impl_;
};

}  // namespace

// `impl` (a Python object with c10d's collectives as methods, and `rank()`
// and `size()`) as a torch.distributed Backend: a new reference, null with
// a Python error set.
extern "C" void* tt_python_backend(void* impl) {
  HANDLE_TH_ERRORS
  auto object = py::reinterpret_borrow<py::object>(static_cast<PyObject*>(impl));
  const int rank = object.attr("rank")().cast<int>(), size = object.attr("size")().cast<int>();
  c10::intrusive_ptr<c10d::Backend> backend = c10::make_intrusive<PythonBackend>(object, rank, size);
  return py::cast(backend).release().ptr();
  END_HANDLE_TH_ERRORS
}

// The Python object a Backend made by `tt_python_backend` carries (a new
// reference); None for any other Backend or object.
extern "C" void* tt_python_backend_impl(void* backend) {
  HANDLE_TH_ERRORS
  auto handle = py::handle(static_cast<PyObject*>(backend));
  py::object impl = py::none();
  try {
    auto made = handle.cast<c10::intrusive_ptr<c10d::Backend>>();
    if (auto* ours = dynamic_cast<PythonBackend*>(made.get())) impl = ours->impl();
  } catch (const py::cast_error&) {
  }
  return impl.release().ptr();
  END_HANDLE_TH_ERRORS
}

// PREMUL_SUM's factor (a float or a one-element tensor), which these
// versions' ReduceOp does not show Python: a new reference, null with a
// Python error set.
extern "C" void* tt_premul_factor(void* op) {
  HANDLE_TH_ERRORS
  const auto& reduce_op = py::handle(static_cast<PyObject*>(op)).cast<const c10d::ReduceOp&>();
  const auto* premul = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(reduce_op.supplement_.get());
  TORCH_CHECK(premul, "torchtpu: a PREMUL_SUM reduce op without its factor");
  py::object factor =
      premul->tensor_factor.defined() ? py::cast(premul->tensor_factor) : py::cast(premul->double_factor);
  return factor.release().ptr();
  END_HANDLE_TH_ERRORS
}

#else

#include <Python.h>

// torch 2.15 and later let Python subclass c10d's Backend: nothing to carry.
extern "C" void* tt_python_backend(void*) {
  PyErr_SetString(PyExc_RuntimeError, "torchtpu: this torch's c10d takes Python backends as they are");
  return nullptr;
}

extern "C" void* tt_python_backend_impl(void*) {
  Py_RETURN_NONE;
}

extern "C" void* tt_premul_factor(void*) {
  PyErr_SetString(PyExc_RuntimeError, "torchtpu: this torch's ReduceOp shows its factor");
  return nullptr;
}

#endif
