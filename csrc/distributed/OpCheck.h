// Cross-rank argument check of a collective (what NCCL leaves to
// TORCH_DISTRIBUTED_DEBUG=DETAIL and Gloo partly checks itself).
//
// Every rank contributes a fixed-size fingerprint of its call (op, sequence
// number, dtype, sizes, root, reduce op, split sizes); transports exchange
// them before moving data (Gloo: one small all_gather; shared memory: the
// ranks' control slots), and each rank compares all of them with its own
// arguments. A mismatch fails the collective on every rank with a message
// naming the ranks and what differs, before any payload moves, so the group
// stays usable (ranks still agree on what ran).
#pragma once

#include "CollectiveOp.h"

#include <cstdint>
#include <string>
#include <vector>

namespace c10d::vnpu {

// Number of int64 entries of a fingerprint in a group of `world` ranks.
size_t fingerprintLength(int world);

// Fingerprint of `op` as issued by `rank` (length fingerprintLength(world)).
std::vector<int64_t> fingerprint(const CollectiveOp& op, int rank, int world);

// Compares `all` (world fingerprints, rank-major) with `op` as issued by
// `rank`; returns "" when compatible, else a message naming the mismatch.
std::string checkFingerprints(const CollectiveOp& op, int rank, int world, const int64_t* all);

// The per-destination counts in fingerprint `fp`: ALLTOALL_BASE rows (ALLTOALL
// elements) sent to each rank, world entries.
const int64_t* fingerprintSendCounts(const int64_t* fp);

// Whether `type` gets a fingerprint exchange (collectives and barriers; not
// point-to-point transfers, which carry their own size checks).
bool isCheckedCollective(OpType type);

}  // namespace c10d::vnpu
