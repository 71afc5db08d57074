// The fused LSTM/GRU cell ops for vnpu.
//
// ATen's nn.LSTM / nn.GRU / LSTMCell / GRUCell call _thnn_fused_lstm_cell and
// _thnn_fused_gru_cell (and their backward ops) for every non-CPU device; they
// have CUDA kernels only. vnpu computes them with the semantics of the CUDA
// kernels (aten/src/ATen/native/cuda/RNN.cu), including the workspace layout
// the backward ops read, as a few element-wise ATen ops that each run through
// the executor (stream-ordered, no sync).
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace at::vnpu {
namespace {

bool has(const std::optional<Tensor>& t) { return t.has_value() && t->defined(); }

// The checks of CUDA's kernels (RNN.cu checkSizes): 2-D gates of width
// `gates` x hidden size, one batch size, one dtype, 1-D biases of the gates' width.
void check_cell(const char* op, const Tensor& input_gates, const Tensor& hidden_gates, const Tensor& state,
                const std::optional<Tensor>& input_bias, const std::optional<Tensor>& hidden_bias, int64_t gates) {
  TORCH_CHECK(input_gates.dim() == 2 && hidden_gates.dim() == 2 && state.dim() == 2, op,
              ": expected 2-D input_gates, hidden_gates and state, got ", input_gates.sizes(), ", ",
              hidden_gates.sizes(), ", ", state.sizes());
  TORCH_CHECK(input_gates.sizes() == hidden_gates.sizes(), op, ": input_gates ", input_gates.sizes(),
              " and hidden_gates ", hidden_gates.sizes(), " must have the same size");
  TORCH_CHECK(input_gates.size(0) == state.size(0) && input_gates.size(1) == gates * state.size(1), op,
              ": gates of size ", input_gates.sizes(), " do not match a state of size ", state.sizes(),
              " (expected [batch, ", gates, " * hidden])");
  TORCH_CHECK(hidden_gates.scalar_type() == input_gates.scalar_type() && state.scalar_type() == input_gates.scalar_type(),
              op, ": expected all inputs to have dtype ", input_gates.scalar_type());
  for (const auto* b : {&input_bias, &hidden_bias}) {
    if (!has(*b)) continue;
    TORCH_CHECK((*b)->dim() == 1 && (*b)->size(0) == input_gates.size(1), op, ": expected a bias of size [",
                input_gates.size(1), "], got ", (*b)->sizes());
    TORCH_CHECK((*b)->scalar_type() == input_gates.scalar_type(), op, ": expected the bias to have dtype ",
                input_gates.scalar_type());
  }
  TORCH_CHECK(has(input_bias) == has(hidden_bias), op, ": expected both biases or none");
}

void check_workspace(const char* op, const Tensor& workspace, const Tensor& like, int64_t parts) {
  TORCH_CHECK(workspace.dim() == 2 && like.dim() == 2 && workspace.size(0) == like.size(0) &&
                  workspace.size(1) == parts * like.size(1),
              op, ": workspace of size ", workspace.sizes(), " does not match [batch, ", parts,
              " * hidden] for ", like.sizes());
}

// gates: (N, 4H) pre-activation sums; returns hy, cy (N, H) and the workspace
// (N, 4H): the activated input, forget, cell and output gates.
std::tuple<Tensor, Tensor, Tensor> fused_lstm_cell(const Tensor& input_gates, const Tensor& hidden_gates,
                                                   const Tensor& cx, const std::optional<Tensor>& input_bias,
                                                   const std::optional<Tensor>& hidden_bias) {
  check_cell("_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, input_bias, hidden_bias, 4);
  Tensor gates = input_gates + hidden_gates;
  if (has(input_bias)) gates = gates + *input_bias;
  if (has(hidden_bias)) gates = gates + *hidden_bias;
  auto chunks = gates.chunk(4, 1);
  Tensor ig = chunks[0].sigmoid(), fg = chunks[1].sigmoid(), cg = chunks[2].tanh(), og = chunks[3].sigmoid();
  Tensor cy = fg * cx + ig * cg;
  Tensor hy = og * cy.tanh();
  return {hy, cy, at::cat({ig, fg, cg, og}, 1)};
}

// Returns grad of the gates (N, 4H), of cx (N, H) and of the bias (4H, only if
// has_bias). Undefined grad_hy / grad_cy count as zeros.
std::tuple<Tensor, Tensor, Tensor> fused_lstm_cell_backward_impl(const std::optional<Tensor>& grad_hy,
                                                                 const std::optional<Tensor>& grad_cy,
                                                                 const Tensor& cx, const Tensor& cy,
                                                                 const Tensor& workspace, bool has_bias) {
  if (!has(grad_hy) && !has(grad_cy)) return {Tensor(), Tensor(), Tensor()};
  TORCH_CHECK(cx.sizes() == cy.sizes(), "_thnn_fused_lstm_cell_backward: cx ", cx.sizes(), " and cy ", cy.sizes(),
              " must have the same size");
  for (const auto* g : {&grad_hy, &grad_cy}) {
    TORCH_CHECK(!has(*g) || (*g)->sizes() == cy.sizes(), "_thnn_fused_lstm_cell_backward: gradient of size ",
                (*g)->sizes(), " does not match ", cy.sizes());
  }
  check_workspace("_thnn_fused_lstm_cell_backward", workspace, cy, 4);
  auto w = workspace.chunk(4, 1);
  const Tensor &ig = w[0], &fg = w[1], &cg = w[2], &og = w[3];
  Tensor tanh_cy = cy.tanh();
  Tensor g_cy;  // total gradient reaching cy
  Tensor g_og;
  if (has(grad_hy)) {
    g_og = *grad_hy * tanh_cy * og * (1 - og);
    g_cy = *grad_hy * og * (1 - tanh_cy * tanh_cy);
    if (has(grad_cy)) g_cy = g_cy + *grad_cy;
  } else {
    g_og = at::zeros_like(og);
    g_cy = *grad_cy;
  }
  Tensor g_ig = g_cy * cg * ig * (1 - ig);
  Tensor g_fg = g_cy * cx * fg * (1 - fg);
  Tensor g_cg = g_cy * ig * (1 - cg * cg);
  Tensor grad_gates = at::cat({g_ig, g_fg, g_cg, g_og}, 1);
  Tensor grad_cx = g_cy * fg;
  Tensor grad_bias = has_bias ? grad_gates.sum(0) : Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

// input_gates, hidden_gates: (N, 3H) in (reset, input/update, new) order;
// returns hy (N, H) and the workspace (N, 5H): r, z, n, hx, and the hidden
// new-gate pre-activation (with its bias).
std::tuple<Tensor, Tensor> fused_gru_cell(const Tensor& input_gates, const Tensor& hidden_gates, const Tensor& hx,
                                          const std::optional<Tensor>& input_bias,
                                          const std::optional<Tensor>& hidden_bias) {
  check_cell("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, input_bias, hidden_bias, 3);
  Tensor ig = has(input_bias) ? input_gates + *input_bias : input_gates;
  Tensor hg = has(hidden_bias) ? hidden_gates + *hidden_bias : hidden_gates;
  auto i = ig.chunk(3, 1);
  auto h = hg.chunk(3, 1);
  Tensor r = (i[0] + h[0]).sigmoid();
  Tensor z = (i[1] + h[1]).sigmoid();
  Tensor n = (i[2] + r * h[2]).tanh();
  Tensor hy = n + z * (hx - n);
  return {hy, at::cat({r, z, n, hx, h[2]}, 1)};
}

// Returns grads of input_gates, hidden_gates (N, 3H), hx (N, H), and of the
// two biases (3H, only if has_bias).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> fused_gru_cell_backward(const Tensor& grad_hy,
                                                                           const Tensor& workspace, bool has_bias) {
  check_workspace("_thnn_fused_gru_cell_backward", workspace, grad_hy, 5);
  auto w = workspace.chunk(5, 1);
  const Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  Tensor g_z = grad_hy * (hx - n) * (1 - z) * z;
  Tensor grad_hx = grad_hy * z;
  Tensor g_n = grad_hy * (1 - z) * (1 - n * n);
  Tensor g_hn = g_n * r;
  Tensor g_r = g_n * hn * (1 - r) * r;
  Tensor grad_input_gates = at::cat({g_r, g_z, g_n}, 1);
  Tensor grad_hidden_gates = at::cat({g_r, g_z, g_hn}, 1);
  Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : Tensor();
  Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward_impl));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward));
}

}  // namespace at::vnpu
