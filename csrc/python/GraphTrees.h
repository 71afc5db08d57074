// Bindings for Inductor's graph trees on vnpu (GraphTrees.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace torch_vnpu {

// Adds _get_checkpoint_state, _set_checkpoint_pool_state, _check_pool_live_allocations, _has_standard_deleter,
// _free_and_remove_deleter, _construct_tensor_from_storage_and_metadata, _tensors_data_ptrs_at_indices_equal,
// _set_storage_access_error_msg and _set_storage_data_ptr_access_error_msg to the module.
void bind_graph_trees(pybind11::module& m);

}  // namespace torch_vnpu
