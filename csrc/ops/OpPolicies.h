// Per-op facts the schema does not tell, found by the OpInfo sweep and its
// probes (src/torch_vnpu/testing/opinfo.py). Names are "aten::op" or
// "aten::op.overload". Each table says why its ops are in it.
#pragma once

#include <string>

namespace at::vnpu {

// Note [out= kernels that read their outputs]
// vnpu runs a functional op through its out= overload, writing straight into
// the planned outputs. That is only right if the out= kernel computes what the
// functional kernel computes. CPU's batch_norm_cpu_out does not for
// non-contiguous inputs in training: it takes the mean from `save_mean`, which
// the functional batch_norm_cpu fills (at::mean) before calling it, so a direct
// out= call reads an uninitialised mean (CPU itself gives the same wrong
// values when called with out=). For these ops an input that is not
// contiguous runs the functional kernel plus a copy, and an explicit call of
// their out= overload runs the functional overload plus copies into the out=
// tensors (vnpu is right where CPU reads uninitialised memory).
bool out_needs_contiguous_input(const std::string& name);

// Note [Checks Meta kernels lack]
// Output metadata comes from Meta kernels, checked against CPU once per
// signature (Note [Meta kernels are checked against CPU]). Some Meta kernels
// lack argument checks that CPU's kernel makes on the host (uniform_'s from <=
// to, a convolution's dilation > 0, index_add's source shape, ...): a call that
// reuses a validated signature with bad arguments would fail only on the
// stream, at the next synchronization. For these ops every new metadata key
// (new sizes, ints, floats) is checked on CPU, so such errors are raised at the
// call. Found by running every OpInfo error input on Meta and on CPU.
bool meta_lacks_checks(const std::string& name);

// Ops whose kernel reads data on the host to check its arguments in
// device-generic code, so CUDA synchronizes for them too (multinomial checks
// the probabilities with .item(); normal with a tensor std checks std.min() >=
// 0; searchsorted checks a sorter's range): they run synchronously and raise
// at the call. Returns nullptr if `name` is not such an op, "" if it always
// checks, else the name of the argument whose presence makes it check.
const char* host_checks_data(const std::string& name);

// Ops tagged dynamic_output_shape whose output shape depends on the data only
// for boolean (or uint8) mask arguments: x[mask] counts the mask's ones (CUDA
// synchronizes for it: nonzero), x[int_idx] has the index's shape and CUDA's
// kernel runs asynchronously. Returns the name of the list argument whose masks
// make the op synchronous, or nullptr.
const char* sync_only_for_masks(const std::string& name);

// Note [Deterministic alerts at the call]
// Under torch.use_deterministic_algorithms(True) these CPU kernels raise (or
// warn) "... does not have a deterministic implementation" from inside the
// kernel, which on a stream worker would surface one synchronization late, or
// never if the mode was switched off before the stream got there. CUDA raises
// at the call, so in that mode they run synchronously. The set is CPU's (every
// OpInfo sample run on CPU under the mode): vnpu runs CPU's kernels, which are
// deterministic elsewhere.
bool alerts_if_deterministic(const std::string& name);

}  // namespace at::vnpu
