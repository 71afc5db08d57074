// Out kernels: ops whose CPU kernel has no out= overload but is a thin shell
// around a kernel that writes into outputs it allocated. vnpu runs that inner
// kernel on the outputs the executor allocated in device memory, as the
// out= path does for other ops, instead of the functional kernel plus a copy
// (Executor.h, step 2). Each checks its arguments as the CPU op does.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include <string>
#include <vector>

namespace at::vnpu {

// args: the op's arguments as CPU aliases (schema order); outs: the aliases of
// its planned outputs (one per return). Runs on the stream's worker.
using OutKernel = void (*)(const torch::jit::Stack& args, const std::vector<c10::IValue>& outs);

// The out kernel of `op_name` ("aten::name" or "aten::name.overload"), or nullptr.
OutKernel find_out_kernel(const std::string& op_name);

}  // namespace at::vnpu
