#include "OpPolicies.h"

#include <unordered_map>
#include <unordered_set>

namespace at::vnpu {
namespace {
bool in(const std::unordered_set<std::string>& set, const std::string& name) { return set.count(name) > 0; }
}  // namespace

bool out_needs_contiguous_input(const std::string& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::native_batch_norm", "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit.no_stats",
      "aten::_batch_norm_with_update"};
  return in(ops, name);
}

bool alerts_if_deterministic(const std::string& name) {
  static const std::unordered_set<std::string> ops = {"aten::put_",         "aten::put",
                                                      "aten::put.out",      "aten::max_unpool2d",
                                                      "aten::max_unpool2d.out", "aten::max_unpool3d",
                                                      "aten::max_unpool3d.out"};
  return in(ops, name);
}

bool meta_lacks_checks(const std::string& name) {
  static const std::unordered_set<std::string> ops = {
      // scalar arguments
      "aten::uniform_", "aten::bernoulli_.float", "aten::normal.Tensor_float", "aten::normal.Tensor_float_out",
      "aten::normal_", "aten::huber_loss", "aten::huber_loss.out", "aten::huber_loss_backward",
      "aten::huber_loss_backward.out", "aten::multinomial", "aten::multinomial.out",
      // int and list arguments, sizes
      "aten::convolution", "aten::convolution_overrideable", "aten::convolution_backward",
      "aten::convolution_backward_overrideable", "aten::index_add", "aten::index_add_", "aten::index_add.out",
      "aten::as_strided_scatter", "aten::as_strided_scatter.out",
      // source/value shapes checked against the index or mask (CPU raises at the call)
      "aten::_index_put_impl_", "aten::index_put_", "aten::index_put", "aten::index_put.out",
      "aten::masked_scatter_", "aten::masked_scatter", "aten::masked_scatter.out", "aten::put_", "aten::put",
      "aten::put.out", "aten::index_reduce_", "aten::index_reduce", "aten::index_reduce.out"};
  return in(ops, name);
}

const char* host_checks_data(const std::string& name) {
  static const std::unordered_map<std::string, const char*> ops = {
      {"aten::multinomial", ""}, {"aten::multinomial.out", ""}, {"aten::normal.Tensor_Tensor", ""},
      {"aten::normal.Tensor_Tensor_out", ""}, {"aten::normal.float_Tensor", ""},
      {"aten::normal.float_Tensor_out", ""}, {"aten::searchsorted.Tensor", "sorter"},
      {"aten::searchsorted.Tensor_out", "sorter"}, {"aten::searchsorted.Scalar", "sorter"},
      {"aten::searchsorted.Scalar_out", "sorter"}};
  auto it = ops.find(name);
  return it == ops.end() ? nullptr : it->second;
}

const char* sync_only_for_masks(const std::string& name) {
  return name == "aten::index.Tensor" ? "indices" : nullptr;
}

}  // namespace at::vnpu
