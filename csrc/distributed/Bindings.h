// Python bindings of vccl (see Bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace torch_vnpu::distributed {

// Adds torch_vnpu._C._init_distributed(), which defines torch_vnpu._C._distributed on first call.
void init_module(pybind11::module& parent);

}  // namespace torch_vnpu::distributed
