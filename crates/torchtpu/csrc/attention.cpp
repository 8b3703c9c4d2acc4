// scaled_dot_product_attention on tpu. PyTorch asks each backend which
// kernel to run (_fused_sdp_choice); ours answers "overrideable", the fused
// operator a device plugs in (as OpenReg does), whenever it computes what
// the math composite would. One op then replaces the composite's dozen per
// call (scale, grouped heads' expand, causal mask, two products, softmax)
// and their autograd nodes; its backward is one op too, and a dropout needs
// no mask kept between them (the backward draws it again from the key the
// forward returns as philox seed and offset). The math composite still
// serves the rest (f64, other ranks, heads that only broadcast, p = 1), and
// `sdpa_kernel(SDPBackend.MATH)` chooses it.
#include "adapter.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

namespace torchtpu {
namespace {

// Whether the fused op computes this call as the composite would: a
// dropout that keeps something (p < 1), 4-d operands of one float32,
// float16 or bfloat16 dtype (f64 gradients would go through a float32
// log-sum-exp), the same batch, key and value heads alike, query heads
// equal to them or, with enable_gqa, a multiple (grouped-query attention),
// and a mask that broadcasts to the scores without a causal flag beside it.
bool fused_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal, bool enable_gqa) {
  auto dtype = q.scalar_type();
  bool operands = q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.scalar_type() == dtype &&
                  v.scalar_type() == dtype &&
                  (dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16) &&
                  q.numel() > 0 && k.numel() > 0 && v.numel() > 0;
  if (!(dropout_p >= 0 && dropout_p < 1) || !operands) return false;
  bool shapes = q.size(0) == k.size(0) && k.size(0) == v.size(0) && k.size(1) == v.size(1) &&
                k.size(2) == v.size(2) && q.size(3) == k.size(3) &&
                (q.size(1) == k.size(1) || (enable_gqa && q.size(1) % k.size(1) == 0));
  if (!shapes || !mask.has_value()) return shapes;
  if (is_causal || mask->dim() > 4) return false;
  const int64_t scores[4] = {q.size(0), q.size(1), q.size(2), k.size(2)};
  for (int64_t d = 1; d <= mask->dim(); ++d) {
    int64_t m = mask->size(-d);
    if (m != 1 && m != scores[4 - d]) return false;
  }
  return true;
}

int64_t choose_sdp(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                   std::optional<double> /*scale*/, bool enable_gqa) {
  auto& ctx = at::globalContext();
  if (ctx.userEnabledOverrideableSDP() && fused_fits(q, k, v, mask, dropout_p, is_causal, enable_gqa)) {
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  }
  return static_cast<int64_t>(ctx.userEnabledMathSDP() ? at::SDPBackend::math : at::SDPBackend::error);
}

// Where the meta functions put a result: dense strides in a tensor's
// dimension order (empty_like, alloc_with_matching_layout), so that a
// compiled graph's views of it (a.transpose(1, 2).view(b, t, d)) hold at
// run time too. The core computes the result with its dimensions in
// `order` (outermost in memory first); it is then viewed with `strides`.
struct Layout {
  std::vector<int64_t> strides, order;

  explicit Layout(std::vector<int64_t> s) : strides(std::move(s)), order(strides.size()) {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  }

  // empty_like(like)'s.
  static Layout like(const at::Tensor& t) {
    return Layout(t.is_non_overlapping_and_dense() ? t.strides().vec() : at::infer_dense_strides(t.sizes(), t.strides()));
  }

  // alloc_with_matching_layout(q, sizes)'s: empty_like(q) for q's shape, else
  // strides filled from q's innermost dimension out (stride 0 last).
  static Layout matching(const at::Tensor& q, c10::IntArrayRef sizes) {
    if (q.sizes() == sizes) return like(q);
    std::vector<int64_t> fill(sizes.size()), strides(sizes.size());
    std::iota(fill.begin(), fill.end(), 0);
    auto key = [&](int64_t d) { return q.stride(d) ? q.stride(d) : std::numeric_limits<int64_t>::max(); };
    std::stable_sort(fill.begin(), fill.end(), [&](int64_t a, int64_t b) { return key(a) < key(b); });
    int64_t stride = 1;
    for (int64_t d : fill) {
      strides[d] = stride;
      stride *= sizes[d];
    }
    return Layout(std::move(strides));
  }

  at::Tensor view(const at::Tensor& stored, c10::IntArrayRef sizes) const {
    return stored.defined() ? stored.as_strided(sizes, strides) : stored;
  }
};

void check_fused(double dropout_p) {
  TORCH_CHECK(dropout_p >= 0 && dropout_p < 1, "tpu's fused attention takes dropout_p in [0, 1), got ", dropout_p,
              "; scaled_dot_product_attention runs PyTorch's math kernel for dropout_p = 1");
}

using FusedAttention = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt,
                                  at::Tensor, at::Tensor, at::Tensor>;

// The sequence lengths it returns are the inputs' (known here, without
// reading the device). The core computes the output, the log-sum-exp and
// the dropout's key (zeros without dropout; AOTAutograd saves both for the
// backward as tensors): torchtpu::attention.
FusedAttention fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::optional<at::Tensor>& bias, double dropout_p, bool is_causal,
                               bool return_debug_mask, std::optional<double> scale) {
  check_fused(dropout_p);
  TORCH_CHECK(!return_debug_mask, "tpu's fused attention returns no debug attention mask");
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchtpu::attention", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const std::optional<at::Tensor>&, double, bool, std::optional<double>,
                           c10::IntArrayRef)>();
  TORCH_CHECK(q.dim() == 4 && v.dim() == 4, "tpu's fused attention takes 4-d query, key and value");
  const int64_t sizes[4] = {q.size(0), q.size(1), q.size(2), v.size(3)};
  auto layout = Layout::matching(q, sizes);
  auto [stored, lse, seed, offset] = op.call(q, k, v, bias, dropout_p, is_causal, scale, layout.order);
  return {layout.view(stored, sizes), lse, at::Tensor(), at::Tensor(), q.sym_size(2), k.sym_size(2), seed, offset,
          at::Tensor()};
}

using Gradients = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Each gradient laid out as empty_like of its input (the meta function's).
Gradients fused_attention_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& bias, std::array<bool, 4> wanted,
                                   const at::Tensor& out, const at::Tensor& logsumexp,
                                   const at::Tensor& /*cum_seq_q*/, const at::Tensor& /*cum_seq_k*/,
                                   c10::SymInt /*max_q*/, c10::SymInt /*max_k*/, double dropout_p, bool is_causal,
                                   const at::Tensor& philox_seed, const at::Tensor& philox_offset,
                                   std::optional<double> scale) {
  check_fused(dropout_p);
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchtpu::attention_backward", "")
                       .typed<Gradients(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&,
                                        c10::ArrayRef<bool>, double, bool, std::optional<double>, const at::Tensor&,
                                        const at::Tensor&, c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef,
                                        c10::IntArrayRef)>();
  std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  auto lq = Layout::like(q), lk = Layout::like(k), lv = Layout::like(v);
  auto lb = bias.defined() ? Layout::like(bias) : Layout({});
  auto [dq, dk, dv, db] = op.call(grad, q, k, v, b, out, logsumexp, wanted, dropout_p, is_causal, scale, philox_seed,
                                  philox_offset, lq.order, lk.order, lv.order, lb.order);
  return {lq.view(dq, q.sizes()), lk.view(dk, k.sizes()), lv.view(dv, v.sizes()),
          bias.defined() ? lb.view(db, bias.sizes()) : db};
}

}  // namespace
}  // namespace torchtpu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchtpu::choose_sdp)
}

TORCH_LIBRARY_FRAGMENT(torchtpu, m) {
  // The fused attention's output [B, Hq, L, Ev] with its dimensions in
  // `layout`'s order, log-sum-exp [B, Hq, L] (float32) and the dropout's
  // key as two 0-d int64 tensors (zeros without dropout).
  m.def("attention(Tensor query, Tensor key, Tensor value, Tensor? attn_bias, float dropout_p, bool is_causal, "
        "float? scale, int[] layout) -> (Tensor output, Tensor logsumexp, Tensor philox_seed, "
        "Tensor philox_offset)");
  // Its gradients (those grad_input_mask asks for, else undefined), each
  // with its dimensions in its layout's order, from the forward's output
  // and log-sum-exp.
  m.def("attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor? attn_bias, "
        "Tensor out, Tensor logsumexp, bool[4] grad_input_mask, float dropout_p, bool is_causal, float? scale, "
        "Tensor philox_seed, Tensor philox_offset, int[] query_layout, int[] key_layout, int[] value_layout, "
        "int[] attn_bias_layout) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value, Tensor grad_attn_bias)");
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(torchtpu::fused_attention));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(torchtpu::fused_attention_backward));
}
