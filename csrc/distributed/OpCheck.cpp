#include "OpCheck.h"

#include <c10/core/ScalarType.h>
#include <c10/util/StringUtil.h>

#include <sstream>

namespace c10d::vnpu {
namespace {

// Header fields; then `world` entries A[r] and `world` entries B[r] whose
// meaning depends on the op (see fingerprint()).
enum Field : size_t {
  kMagic, kSeq, kType, kDtype, kCount, kInNumel, kOutNumel, kRedOp, kRoot, kRowNumel, kNdim,
  kShape0, kHeader = kShape0 + 6,
};
constexpr int64_t kMagicValue = 0x7663636c;  // "vccl"

int64_t numel(const TensorSpec& s) {
  int64_t n = 1;
  for (auto d : s.sizes) n *= d;
  return s.defined ? n : 0;
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
  const size_t len = fingerprintLength(world);
  const int64_t* me = all + rank * len;
  auto at = [&](int r) { return all + r * len; };
  auto prefix = [&] { return c10::str("vccl: ", op.name, " #", op.seq, " on rank ", rank, ": "); };
  for (int r = 0; r < world; ++r) {
    const int64_t* o = at(r);
    if (o[kMagic] != kMagicValue) {
      return c10::str(prefix(), "rank ", r, " sent no valid call description; it is probably running "
                      "a different collective (or backend) at this point");
    }
    if (o[kType] != me[kType] || o[kSeq] != me[kSeq]) {
      return c10::str(prefix(), "rank ", r, " called ", opName(o[kType]), " #", o[kSeq], " while rank ", rank,
                      " called ", opName(me[kType]), " #", me[kSeq],
                      "; every rank of a group must call the same collectives in the same order");
    }
  }
  const auto type = static_cast<OpType>(me[kType]);
  if (type == OpType::BARRIER) return "";
  const int64_t* a = me + kHeader;
  const int64_t* b = a + world;
  for (int r = 0; r < world; ++r) {
    const int64_t* o = at(r);
    const int64_t* oa = o + kHeader;
    if (o[kDtype] != me[kDtype]) {
      return c10::str(prefix(), "rank ", r, " passed dtype ", dtypeName(o[kDtype]), " but rank ", rank,
                      " passed dtype ", dtypeName(me[kDtype]), "; every rank must pass the same dtype");
    }
    if (o[kRoot] != me[kRoot]) {
      return c10::str(prefix(), "rank ", r, " named root ", o[kRoot], " but rank ", rank, " named root ",
                      me[kRoot], "; every rank must name the same root");
    }
    if (o[kRedOp] != me[kRedOp]) {
      return c10::str(prefix(), "rank ", r, " asked for reduce op ", o[kRedOp], " but rank ", rank,
                      " for ", me[kRedOp], " (ReduceOp enum values); every rank must use the same op");
    }
    if (o[kCount] != me[kCount] && type != OpType::GATHER && type != OpType::SCATTER) {
      return c10::str(prefix(), "rank ", r, " passed ", o[kCount], " input tensors but rank ", rank,
                      " passed ", me[kCount]);
    }
    std::string mismatch;
    switch (type) {
      case OpType::ALLGATHER:
      case OpType::ALLGATHER_COALESCED:
        if (o[kInNumel] != a[r])
          mismatch = c10::str("rank ", r, " contributes ", o[kInNumel], " elements (input shape ", shapeOf(o),
                              ") but rank ", rank, "'s output tensor for it holds ", a[r], " elements");
        break;
      case OpType::GATHER:
        if (rank == op.root && o[kInNumel] != a[r])
          mismatch = c10::str("rank ", r, " sends ", o[kInNumel], " elements (shape ", shapeOf(o),
                              ") but the root's gather_list entry for it holds ", a[r], " elements");
        else if (r == op.root && rank != op.root) {
          const int64_t* ra = o + kHeader;
          if (ra[rank] != me[kInNumel])
            mismatch = c10::str("rank ", rank, " sends ", me[kInNumel], " elements but the root's gather_list entry "
                                "for it holds ", ra[rank], " elements");
        }
        break;
      case OpType::SCATTER:
        if (r == op.root) {
          const int64_t* ra = o + kHeader;
          if (ra[rank] != me[kOutNumel])
            mismatch = c10::str("the root's scatter_list entry for rank ", rank, " holds ", ra[rank],
                                " elements but rank ", rank, "'s output tensor holds ", me[kOutNumel]);
        }
        break;
      case OpType::ALLTOALL_BASE:
        if (o[kRowNumel] != me[kRowNumel] && oa[rank] > 0)
          mismatch = c10::str("rank ", r, "'s input rows hold ", o[kRowNumel], " elements but rank ", rank,
                              "'s output rows hold ", me[kRowNumel]);
        else if (oa[rank] != b[r])
          mismatch = c10::str("rank ", r, " sends ", oa[rank], " rows to rank ", rank, " but rank ", rank,
                              " expects ", b[r], " rows from it (output_split_sizes)");
        break;
      case OpType::ALLTOALL:
        if (oa[rank] != b[r])
          mismatch = c10::str("rank ", r, " sends ", oa[rank], " elements to rank ", rank, " but rank ", rank,
                              "'s output tensor for it holds ", b[r], " elements");
        break;
      default:
        if (o[kInNumel] != me[kInNumel] || o[kOutNumel] != me[kOutNumel])
          mismatch = c10::str("rank ", r, " passed ", o[kInNumel], " elements (shape ", shapeOf(o), ") but rank ",
                              rank, " passed ", me[kInNumel], " elements (shape ", shapeOf(me), ")");
        break;
    }
    if (!mismatch.empty()) {
      return c10::str(prefix(), mismatch, "; every rank must pass tensors of matching sizes");
    }
  }
  (void)a;
  return "";
}

}  // namespace c10d::vnpu
