// Compiled graphs (torch.compile): the torchtpu operators the Dynamo backend
// calls. A call marshals the graph's tensors and numbers, lets the core run
// its plan, and builds the outputs: views of new storages or of inputs'.
#include "adapter.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

namespace torchtpu {
namespace {

// A graph's arguments as the core takes them: its tensors, then its numbers.
struct GraphArgs {
  std::vector<TtTensor> tensors;
  std::vector<TtArg> args;

  GraphArgs(at::TensorList inputs, at::ArrayRef<at::Scalar> numbers) {
    tensors.reserve(inputs.size());
    for (const auto& t : inputs) tensors.push_back(describe(t));
    for (const auto& d : tensors) {
      TtArg a{};
      a.kind = TT_ARG_TENSOR;
      a.len = 1;
      a.tensors = &d;
      args.push_back(a);
    }
    for (const auto& s : numbers) {
      TtArg a{};
      if (s.isBoolean()) {
        a.kind = TT_ARG_BOOL;
        a.i = s.toBool();
      } else if (s.isIntegral(false)) {
        a.kind = TT_ARG_INT;
        a.i = s.toLong();
      } else {
        TORCH_CHECK(s.isFloatingPoint(), "torchtpu: a compiled graph's number input is complex: ", s);
        a.kind = TT_ARG_FLOAT;
        a.f = s.toDouble();
      }
      args.push_back(a);
    }
  }
};

std::vector<at::Tensor> make_views(const TtGraphResults& r, at::TensorList inputs) {
  std::vector<c10::Storage> storages;
  storages.reserve(r.nstorages);
  for (int64_t k = 0; k < r.nstorages; ++k) storages.push_back(adopt_storage(r.storages[k]));
  std::vector<at::Tensor> views;
  views.reserve(r.nviews);
  for (int64_t k = 0; k < r.nviews; ++k) {
    const TtView& v = r.views[k];
    c10::Storage storage = v.source >= 0 ? storages.at(v.source) : inputs.at(-1 - v.source).storage();
    auto t = at::detail::make_tensor<c10::TensorImpl>(
        std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        caffe2::TypeMeta::fromScalarType(static_cast<at::ScalarType>(v.dtype)));
    t.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(v.sizes, v.ndim),
                                                   c10::IntArrayRef(v.strides, v.ndim), v.offset);
    views.push_back(std::move(t));
  }
  return views;
}

std::vector<at::Tensor> graph_call(int64_t graph, at::TensorList tensors, at::ArrayRef<at::Scalar> numbers) {
  GraphArgs m(tensors, numbers);
  TtGraphResults r{};
  const int status = tt_graph_call(graph, m.args.data(), static_cast<int64_t>(m.args.size()), &r);
  // The backend captures the graph for this signature, then calls again.
  TORCH_CHECK_NOT_IMPLEMENTED(status != TT_GRAPH_MISS, "torchtpu: compiled graph ", graph,
                              " has no program for this input signature yet");
  check(status);
  return make_views(r, tensors);
}

std::vector<at::Tensor> capture_begin(int64_t graph, at::TensorList tensors, at::ArrayRef<at::Scalar> numbers) {
  GraphArgs m(tensors, numbers);
  TtGraphResults r{};
  check(tt_capture_begin(graph, m.args.data(), static_cast<int64_t>(m.args.size()), &r));
  return make_views(r, tensors);
}

void capture_end(at::TensorList outputs) {
  std::vector<TtTensor> described;
  described.reserve(outputs.size());
  for (const auto& t : outputs) described.push_back(describe(t));
  check(tt_capture_end(described.data(), static_cast<int64_t>(described.size())));
}

void step_end() { check(tt_step_end()); }

}  // namespace

TORCH_LIBRARY(torchtpu, m) {
  m.def("graph_call(int graph, Tensor[] tensors, Scalar[] numbers) -> Tensor[]", TORCH_FN(graph_call));
  m.def("capture_begin(int graph, Tensor[] tensors, Scalar[] numbers) -> Tensor[]", TORCH_FN(capture_begin));
  m.def("capture_end(Tensor[] outputs) -> ()", TORCH_FN(capture_end));
  // The end of an optimizer step, in a compiled step's graph: fused mode
  // flushes there (a graph that holds it flushes after each call).
  // (An explicit kernel, so that tracing records the op rather than running it.)
  m.def("step_end() -> ()");
  m.impl("step_end", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(step_end));
}

}  // namespace torchtpu
