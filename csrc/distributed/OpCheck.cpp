#include "OpCheck.h"

#include <c10/core/ScalarType.h>
#include <c10/util/StringUtil.h>

#include <sstream>

namespace c10d::vnpu {
namespace {

// Header fields; then `world` entries A[r] and `world` entries B[r] whose
// meaning depends on the op (see fingerprint()).
enum Field : size_t {
  kMagic, kSeq, kType, kDtype, kCount, kInNumel, kOutNumel, kRedOp, kRoot, kRowNumel, kInputs, kNdim,
  kShape0, kHeader = kShape0 + 6,
};
constexpr int64_t kMagicValue = 0x7663636c;  // "vccl"

int64_t numel(const TensorSpec& s) {
  int64_t n = 1;
  for (auto d : s.sizes) n *= d;
  return s.defined ? n : 0;
}

// A digest of every input's element count and dtype, in order (FNV-1a).
int64_t inputsDigest(const std::vector<TensorSpec>& v) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t x) {
    h ^= static_cast<uint64_t>(x);
    h *= 1099511628211ull;
  };
  for (const auto& s : v) {
    mix(numel(s));
    mix(static_cast<int64_t>(s.dtype));
  }
  return static_cast<int64_t>(h);
}

int64_t total(const std::vector<TensorSpec>& v) {
  int64_t n = 0;
  for (const auto& s : v) n += numel(s);
  return n;
}

const TensorSpec* firstTensor(const CollectiveOp& op) {
  if (!op.inputs.empty() && op.inputs[0].defined) return &op.inputs[0];
  if (!op.outputs.empty() && op.outputs[0].defined) return &op.outputs[0];
  return nullptr;
}

bool isReduction(OpType t) {
  return t == OpType::ALLREDUCE || t == OpType::ALLREDUCE_COALESCED || t == OpType::REDUCE ||
         t == OpType::REDUCE_SCATTER || t == OpType::_REDUCE_SCATTER_BASE ||
         t == OpType::REDUCE_SCATTER_TENSOR_COALESCED;
}

bool hasRoot(OpType t) {
  return t == OpType::BROADCAST || t == OpType::REDUCE || t == OpType::GATHER || t == OpType::SCATTER;
}

std::string shapeOf(const int64_t* fp) {
  std::ostringstream os;
  os << "[";
  for (int64_t i = 0; i < fp[kNdim] && i < 6; ++i) os << (i ? ", " : "") << fp[kShape0 + i];
  if (fp[kNdim] > 6) os << ", ...";
  os << "]";
  return os.str();
}

std::string dtypeName(int64_t d) {
  return d < 0 ? "none" : c10::toString(static_cast<c10::ScalarType>(d));
}

const char* opName(int64_t type) {
  switch (static_cast<OpType>(type)) {
    case OpType::BROADCAST: return "broadcast";
    case OpType::ALLREDUCE: return "all_reduce";
    case OpType::ALLREDUCE_COALESCED: return "all_reduce_coalesced";
    case OpType::REDUCE: return "reduce";
    case OpType::ALLGATHER: return "all_gather";
    case OpType::_ALLGATHER_BASE: return "all_gather_into_tensor";
    case OpType::ALLGATHER_COALESCED: return "all_gather_coalesced";
    case OpType::GATHER: return "gather";
    case OpType::SCATTER: return "scatter";
    case OpType::REDUCE_SCATTER: return "reduce_scatter";
    case OpType::_REDUCE_SCATTER_BASE: return "reduce_scatter_tensor";
    case OpType::REDUCE_SCATTER_TENSOR_COALESCED: return "reduce_scatter_tensor_coalesced";
    case OpType::ALLTOALL_BASE: return "all_to_all_single";
    case OpType::ALLTOALL: return "all_to_all";
    case OpType::BARRIER: return "barrier";
    default: return "collective";
  }
}

}  // namespace

size_t fingerprintLength(int world) { return kHeader + 2 * static_cast<size_t>(world); }

const int64_t* fingerprintSendCounts(const int64_t* fp) { return fp + kHeader; }

bool isCheckedCollective(OpType type) {
  return type != OpType::SEND && type != OpType::RECV && type != OpType::RECVANYSOURCE &&
         type != OpType::COALESCED && type != OpType::UNKNOWN;
}

std::vector<int64_t> fingerprint(const CollectiveOp& op, int rank, int world) {
  std::vector<int64_t> fp(fingerprintLength(world), 0);
  int64_t* a = fp.data() + kHeader;
  int64_t* b = a + world;
  fp[kMagic] = kMagicValue;
  fp[kSeq] = static_cast<int64_t>(op.seq);
  fp[kType] = static_cast<int64_t>(op.type);
  const TensorSpec* first = firstTensor(op);
  fp[kDtype] = first ? static_cast<int64_t>(first->dtype) : -1;
  fp[kCount] = static_cast<int64_t>(op.inputs.size());
  fp[kInNumel] = total(op.inputs);
  fp[kOutNumel] = total(op.outputs);
  fp[kInputs] = inputsDigest(op.inputs);
  fp[kRedOp] = isReduction(op.type) ? static_cast<int64_t>(op.reduce_op) : -1;
  fp[kRoot] = hasRoot(op.type) ? op.root : -1;
  if (first) {
    fp[kNdim] = static_cast<int64_t>(first->sizes.size());
    for (size_t i = 0; i < first->sizes.size() && i < 6; ++i) fp[kShape0 + i] = first->sizes[i];
  }
  switch (op.type) {
    case OpType::ALLGATHER:
    case OpType::ALLGATHER_COALESCED:
      // A[r]: elements expected from rank r.
      for (size_t k = 0; k < op.inputs.size(); ++k)
        for (int r = 0; r < world; ++r) a[r] += numel(op.outputs[k * world + r]);
      break;
    case OpType::GATHER:
      if (rank == op.root)
        for (int r = 0; r < world; ++r) a[r] = numel(op.outputs[r]);
      break;
    case OpType::SCATTER:
      if (rank == op.root)
        for (int r = 0; r < world; ++r) a[r] = numel(op.inputs[r]);
      break;
    case OpType::ALLTOALL_BASE: {
      // A[r]: rows sent to r; B[r]: rows expected from r; plus the row size.
      const TensorSpec& in = op.inputs[0];
      const TensorSpec& out = op.outputs[0];
      int64_t in_rows = in.sizes.empty() ? 1 : in.sizes[0];
      int64_t out_rows = out.sizes.empty() ? 1 : out.sizes[0];
      fp[kRowNumel] = in_rows == 0 ? 0 : numel(in) / in_rows;
      for (int r = 0; r < world; ++r) {
        a[r] = op.input_splits.empty() ? in_rows / world : op.input_splits[r];
        b[r] = op.output_splits.empty() ? out_rows / world : op.output_splits[r];
      }
      break;
    }
    case OpType::ALLTOALL:
      for (int r = 0; r < world; ++r) {
        a[r] = numel(op.inputs[r]);
        b[r] = numel(op.outputs[r]);
      }
      break;
    default:
      break;
  }
  return fp;
}

std::string checkFingerprints(const CollectiveOp& op, int rank, int world, const int64_t* all) {
  // Every rank evaluates the same conditions over all fingerprints in the same
  // order, so all ranks reach the same verdict (and the same message): none
  // proceeds to move data while another gave up.
  const size_t len = fingerprintLength(world);
  auto at = [&](int r) { return all + r * len; };
  auto A = [&](int r) { return at(r) + kHeader; };
  auto B = [&](int r) { return at(r) + kHeader + world; };
  auto prefix = [&] { return c10::str("vccl: ", op.name, " #", op.seq, " on rank ", rank, ": "); };
  const int64_t* first = at(0);
  for (int r = 0; r < world; ++r) {
    const int64_t* o = at(r);
    if (o[kMagic] != kMagicValue) {
      return c10::str(prefix(), "rank ", r, " sent no valid call description; it is probably running "
                      "a different collective (or backend) at this point");
    }
    if (o[kType] != first[kType] || o[kSeq] != first[kSeq]) {
      return c10::str(prefix(), "rank ", r, " called ", opName(o[kType]), " #", o[kSeq], " while rank 0 called ",
                      opName(first[kType]), " #", first[kSeq],
                      "; every rank of a group must call the same collectives in the same order");
    }
  }
  const auto type = static_cast<OpType>(first[kType]);
  if (type == OpType::BARRIER) return "";
  for (int r = 1; r < world; ++r) {
    const int64_t* o = at(r);
    if (o[kDtype] != first[kDtype]) {
      return c10::str(prefix(), "rank ", r, " passed dtype ", dtypeName(o[kDtype]), " but rank 0 passed dtype ",
                      dtypeName(first[kDtype]), "; every rank must pass the same dtype");
    }
    if (o[kRoot] != first[kRoot]) {
      return c10::str(prefix(), "rank ", r, " named root ", o[kRoot], " but rank 0 named root ", first[kRoot],
                      "; every rank must name the same root");
    }
    if (o[kRedOp] != first[kRedOp]) {
      return c10::str(prefix(), "rank ", r, " asked for reduce op ", o[kRedOp], " but rank 0 for ", first[kRedOp],
                      " (ReduceOp enum values); every rank must use the same op");
    }
    if (o[kCount] != first[kCount] && type != OpType::GATHER && type != OpType::SCATTER) {
      return c10::str(prefix(), "rank ", r, " passed ", o[kCount], " input tensors but rank 0 passed ",
                      first[kCount]);
    }
    if ((type == OpType::ALLREDUCE_COALESCED || type == OpType::REDUCE_SCATTER_TENSOR_COALESCED) &&
        o[kInputs] != first[kInputs]) {
      return c10::str(prefix(), "rank ", r, " passed input tensors whose element counts or dtypes differ from "
                      "rank 0's; every rank must pass tensors of matching sizes and dtypes, in the same order");
    }
  }
  std::string mismatch;
  const int64_t root = first[kRoot];
  switch (type) {
    case OpType::ALLGATHER:
    case OpType::ALLGATHER_COALESCED:
      for (int p = 0; p < world && mismatch.empty(); ++p)
        for (int r = 0; r < world && mismatch.empty(); ++r)
          if (at(r)[kInNumel] != A(p)[r])
            mismatch = c10::str("rank ", r, " contributes ", at(r)[kInNumel], " elements (input shape ",
                                shapeOf(at(r)), ") but rank ", p, "'s output tensor for it holds ", A(p)[r],
                                " elements");
      break;
    case OpType::GATHER:
      for (int r = 0; r < world && mismatch.empty(); ++r)
        if (at(r)[kInNumel] != A(root)[r])
          mismatch = c10::str("rank ", r, " sends ", at(r)[kInNumel], " elements (shape ", shapeOf(at(r)),
                              ") but the gather_list entry of the root (rank ", root, ") for it holds ", A(root)[r],
                              " elements");
      break;
    case OpType::SCATTER:
      for (int r = 0; r < world && mismatch.empty(); ++r)
        if (A(root)[r] != at(r)[kOutNumel])
          mismatch = c10::str("the scatter_list entry of the root (rank ", root, ") for rank ", r, " holds ",
                              A(root)[r], " elements but rank ", r, "'s output tensor holds ", at(r)[kOutNumel]);
      break;
    case OpType::ALLTOALL_BASE:
      for (int s = 0; s < world && mismatch.empty(); ++s)
        for (int d = 0; d < world && mismatch.empty(); ++d) {
          if (A(s)[d] > 0 && at(s)[kRowNumel] != at(d)[kRowNumel])
            mismatch = c10::str("rank ", s, "'s input rows hold ", at(s)[kRowNumel], " elements but rank ", d,
                                "'s output rows hold ", at(d)[kRowNumel]);
          else if (A(s)[d] != B(d)[s])
            mismatch = c10::str("rank ", s, " sends ", A(s)[d], " rows to rank ", d, " but rank ", d, " expects ",
                                B(d)[s], " rows from it (input_split_sizes / output_split_sizes)");
        }
      break;
    case OpType::ALLTOALL:
      for (int s = 0; s < world && mismatch.empty(); ++s)
        for (int d = 0; d < world && mismatch.empty(); ++d)
          if (A(s)[d] != B(d)[s])
            mismatch = c10::str("rank ", s, " sends ", A(s)[d], " elements to rank ", d, " but rank ", d,
                                "'s output tensor for it holds ", B(d)[s], " elements");
      break;
    default:
      for (int r = 1; r < world && mismatch.empty(); ++r)
        if (at(r)[kInNumel] != first[kInNumel] || at(r)[kOutNumel] != first[kOutNumel])
          mismatch = c10::str("rank ", r, " passed ", at(r)[kInNumel], " elements (shape ", shapeOf(at(r)),
                              ") but rank 0 passed ", first[kInNumel], " elements (shape ", shapeOf(first), ")");
      break;
  }
  if (!mismatch.empty()) return c10::str(prefix(), mismatch, "; every rank must pass tensors of matching sizes");
  return "";
}

}  // namespace c10d::vnpu
