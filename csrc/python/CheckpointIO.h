#pragma once

#include <pybind11/pybind11.h>

namespace torch_vnpu {

void bind_checkpoint_io(pybind11::module& m);

}  // namespace torch_vnpu
