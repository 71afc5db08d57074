#include "ShmTransport.h"

#include "OpCheck.h"
#include "ShmReduce.h"

#include "../core/VNPUAllocatorConfig.h"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <vnpu/runtime.h>

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

namespace c10d::vnpu {

namespace {

constexpr int kMaxWorld = 64;
constexpr int kMaxBufs = 1024;
constexpr size_t kMaxFingerprint = 24 + 2 * kMaxWorld;
constexpr int kMaxDevices = 64;  // the runtime's VNPU_DEVICE_COUNT limit
constexpr std::chrono::milliseconds kLivenessCheck{100};

}  // namespace

// Note [Shared-memory collective protocol] (ShmTransport.h). Written by its
// owner only; std::atomic<uint32_t> is lock-free and address-free, so it works
// across processes, and its words can be futexes.
struct ShmTransport::Ctrl {
  alignas(64) std::atomic<uint32_t> posted;
  alignas(64) std::atomic<uint32_t> done;
  alignas(64) std::atomic<uint32_t> aborted;  // seq of the last collective this rank gave up (timeout, error)
  alignas(64) uint64_t seq;
  int32_t device;
  int32_t nbuf;
  double factor;                 // PREMUL_SUM factor of this rank
  int64_t fp[kMaxFingerprint];   // OpCheck fingerprint
  uint64_t ptr[kMaxBufs];        // device addresses (this rank's address space): inputs, then outputs
  // This rank's device memory, exported on its first collective on each
  // device (not at set-up: creating a group must not initialize vnpu, as
  // NCCL's does not initialize CUDA). Written before `posted`, never changed.
  uint64_t anchor[kMaxDevices];  // 0: not exported (yet)
  vnpuIpcMemHandle_t handle[kMaxDevices];
};

namespace {

using Ctrl = ShmTransport::Ctrl;

bool reached(uint32_t v, uint32_t seq) { return static_cast<int32_t>(v - seq) >= 0; }

void futexWait(std::atomic<uint32_t>* w, uint32_t expected, long timeout_us) {
  timespec ts{timeout_us / 1000000, (timeout_us % 1000000) * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// A process that exited is gone, or a zombie until its parent reaps it (state Z/X).
bool processAlive(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // cannot tell: assume alive (the deadline still applies)
  auto paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ||
         (line[paren + 2] != 'Z' && line[paren + 2] != 'X');
}

// Processes share memory when they run on one machine (boot id), as one user, in one network
// namespace: processes in different network namespaces (containers, simulated hosts) count as
// different hosts and talk over TCP.
std::string hostIdentity() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char netns[128] = {0};
  if (readlink("/proc/self/ns/net", netns, sizeof(netns) - 1) < 0) netns[0] = '?';
  return c10::str(host, '|', boot, '|', getuid(), '|', netns);
}

// One small allocation on `device` whose IPC handle peers open (the handle
// maps the whole device range; the anchor gives the offset). Made on the
// first collective on that device, process-wide, never freed, shared by
// every group. Returns false (and why) if the device cannot be exported.
struct DeviceExport {
  uint64_t anchor = 0;
  vnpuIpcMemHandle_t handle{};
  std::string error;
};

const DeviceExport& deviceExport(int device) {
  static std::mutex mu;
  static std::vector<DeviceExport> exports(kMaxDevices);
  static std::vector<bool> tried(kMaxDevices, false);
  std::lock_guard<std::mutex> g(mu);
  DeviceExport& e = exports.at(static_cast<size_t>(device));
  if (tried[device]) return e;
  tried[device] = true;
  int prev = 0;
  vnpuGetDevice(&prev);
  void* p = nullptr;
  vnpuError_t err = vnpuSetDevice(device);
  if (err == vnpuSuccess) err = vnpuMalloc(&p, 4096);
  if (err == vnpuSuccess) err = vnpuIpcGetMemHandle(&e.handle, p);
  vnpuSetDevice(prev);
  if (err == vnpuSuccess) {
    e.anchor = reinterpret_cast<uint64_t>(p);
  } else {
    e.error = c10::str("cannot export the memory of vnpu:", device, ": ", vnpuGetErrorString(err), " (",
                       vnpuGetLastErrorString(), ")");
  }
  return e;
}

// Whether this process's device memory can be exported, decided from the
// configuration alone (no initialization).
std::string whyNotShareable() {
  int ipc = 1;
  vnpuGetEnvFlag("VNPU_IPC", 1, &ipc);
  if (!ipc) return "VNPU_IPC=0";
  // Expandable segments put tensors in vnpuMemMap-ped ranges, outside the
  // exported linear range: peers could not address them.
  if (c10::vnpu::allocator::config().expandable_segments) return "expandable_segments in PYTORCH_VNPU_ALLOC_CONF";
  return "";
}

int64_t nbytesOf(const TensorSpec& s) {
  int64_t n = 1;
  for (auto d : s.sizes) n *= d;
  return s.defined ? n * static_cast<int64_t>(c10::elementSize(s.dtype)) : 0;
}

int64_t numelOf(const TensorSpec& s) {
  int64_t n = 1;
  for (auto d : s.sizes) n *= d;
  return s.defined ? n : 0;
}

uint64_t addressOf(const TensorSpec& s) {
  if (!s.defined || s.storage_base == nullptr) return 0;
  return reinterpret_cast<uint64_t>(static_cast<char*>(s.storage_base) +
                                    s.storage_offset * static_cast<int64_t>(c10::elementSize(s.dtype)));
}

// [lo, hi) of `count` elements that `rank` reduces: equal slices aligned to 64 bytes.
std::pair<int64_t, int64_t> sliceOf(int64_t count, size_t item, int rank, int world) {
  const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(item));
  int64_t chunk = (count + world - 1) / world;
  chunk = (chunk + align - 1) / align * align;
  const int64_t lo = std::min(count, chunk * rank);
  return {lo, std::min(count, lo + chunk)};
}

void copyIfDistinct(char* dst, const char* src, int64_t n) {
  if (n > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(n));
}

}  // namespace

ShmTransport::ShmTransport(int rank, int world, bool check_args, std::shared_ptr<GlooTransport> gloo)
    : rank_(rank), world_(world), check_args_(check_args), gloo_(std::move(gloo)) {}

ShmTransport::~ShmTransport() {
  // (The Gloo transport is shared: whoever runs this transport shuts it down, not the destructor,
  // which also runs when set-up fails and Gloo takes over.)
  stopped_.store(true);
  for (auto& per_peer : opened_)
    for (void* p : per_peer)
      if (p != nullptr) vnpuIpcCloseMemHandle(p);
}

std::shared_ptr<ShmTransport> ShmTransport::create(const c10::intrusive_ptr<Store>& store, int rank, int world,
                                                   std::chrono::milliseconds timeout, bool check_args,
                                                   std::shared_ptr<GlooTransport> gloo, const std::string& mode,
                                                   std::string* why_not) {
  auto fail = [&](const std::string& why) -> std::shared_ptr<ShmTransport> {
    TORCH_CHECK(mode != "shm", "vccl: VNPU_VCCL_TRANSPORT=shm, but the shared-memory transport is unavailable: ",
                why);
    if (why_not) *why_not = why;
    return nullptr;
  };
  if (world < 2) return fail("a group of one rank needs no transport");
  if (world > kMaxWorld) return fail(c10::str("more than ", kMaxWorld, " ranks"));
  TORCH_INTERNAL_ASSERT(fingerprintLength(world) <= kMaxFingerprint);
  // 1. Are all ranks on this host? (Everyone reads the same keys: the same verdict.)
  store->set(c10::str("shm/host/", rank), hostIdentity());
  const std::string me = hostIdentity();
  for (int r = 0; r < world; ++r) {
    if (store->get_to_str(c10::str("shm/host/", r)) != me) return fail(c10::str("rank ", r, " is on another host"));
  }
  // 2. Publish this rank's control segment and device memory.
  auto t = std::shared_ptr<ShmTransport>(new ShmTransport(rank, world, check_args, std::move(gloo)));
  std::string my_error;
  try {
    t->mine_ = ShmSegment::create(sizeof(Ctrl));
    new (t->mine_.data()) Ctrl();
  } catch (const std::exception& e) {
    my_error = e.what();
  }
  const std::string unshareable = whyNotShareable();
  store->set(c10::str("shm/seg/", rank), my_error.empty() ? ShmSegment::encode(t->mine_.id()) : "-");
  store->set(c10::str("shm/dev/", rank), unshareable.empty() ? "1" : "0" + unshareable);
  if (my_error.empty() && !unshareable.empty()) {
    my_error = c10::str("this rank's device memory is not shareable (", unshareable, ")");
  }
  // 3. Map every peer's segment and device memory.
  t->peers_.resize(world);
  t->pids_.assign(world, 0);
  t->delta_.assign(world, std::vector<int64_t>(kMaxDevices, 0));
  t->opened_.assign(world, std::vector<void*>(kMaxDevices, nullptr));
  for (int r = 0; r < world && my_error.empty(); ++r) {
    try {
      std::string seg = store->get_to_str(c10::str("shm/seg/", r));
      if (seg == "-") throw std::runtime_error(c10::str("rank ", r, " could not create its segment"));
      t->pids_[r] = ShmSegment::decode(seg).pid;
      if (r == rank) continue;
      t->peers_[r] = ShmSegment::open(ShmSegment::decode(seg));
      std::string dev = store->get_to_str(c10::str("shm/dev/", r));
      if (dev != "1") {
        throw std::runtime_error(c10::str("the device memory of rank ", r, " is not shareable (", dev.substr(1), ")"));
      }
    } catch (const std::exception& e) {
      my_error = e.what();
    }
  }
  // 4. Agree: shared memory only if every rank could map everything.
  store->set(c10::str("shm/ok/", rank), my_error.empty() ? "1" : "0" + my_error);
  for (int r = 0; r < world; ++r) {
    std::string ok = store->get_to_str(c10::str("shm/ok/", r));
    if (ok != "1") {
      std::string why = c10::str("rank ", r, ": ", ok.substr(1));
      if (mode != "shm") {
        TORCH_WARN_ONCE("vccl: every rank runs on this host, but the shared-memory transport is unavailable (",
                        why, "); collectives use Gloo over TCP instead (slower)");
      }
      return fail(why);
    }
  }
  (void)timeout;
  return t;
}

Ctrl* ShmTransport::ctrl(int r) const {
  return static_cast<Ctrl*>(r == rank_ ? mine_.data() : peers_[r].data());
}

char* ShmTransport::local(int r, int device, uint64_t addr) {
  if (addr == 0) return nullptr;
  if (r == rank_) return reinterpret_cast<char*>(addr);
  if (device < 0 || device >= kMaxDevices) {
    throw TransportError(c10::str("vccl: rank ", r, " named an invalid device vnpu:", device), true);
  }
  if (opened_[r][device] == nullptr) {
    // Published by rank r before its `posted` word, which this rank acquired.
    const Ctrl* c = ctrl(r);
    if (c->anchor[device] == 0) {
      throw TransportError(c10::str("vccl: the device memory of rank ", r, " (vnpu:", device,
                                    ") could not be exported; see that rank's error"),
                           true);
    }
    void* mapped = nullptr;
    vnpuError_t err = vnpuIpcOpenMemHandle(&mapped, c->handle[device], vnpuIpcMemLazyEnablePeerAccess);
    if (err != vnpuSuccess) {
      throw TransportError(c10::str("vccl: cannot map the device memory of rank ", r, " (vnpu:", device, "): ",
                                    vnpuGetErrorString(err), " (", vnpuGetLastErrorString(), ")"),
                           true);
    }
    opened_[r][device] = mapped;
    delta_[r][device] = static_cast<int64_t>(reinterpret_cast<uint64_t>(mapped) - c->anchor[device]);
  }
  return reinterpret_cast<char*>(addr + static_cast<uint64_t>(delta_[r][device]));
}

void ShmTransport::shutdown(const std::string& reason) {
  stopped_.store(true);
  if (gloo_) gloo_->shutdown(reason);
}

void ShmTransport::waitAll(bool done, uint32_t seq, const CollectiveOp& op) {
  const auto deadline = Clock::now() + op.timeout;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    std::atomic<uint32_t>* w = done ? &ctrl(r)->done : &ctrl(r)->posted;
    auto next_check = Clock::now() + kLivenessCheck;
    for (int spins = 0;; ++spins) {
      uint32_t v = w->load(std::memory_order_acquire);
      if (reached(v, seq)) break;
      if (spins < 200) {
        cpuRelax();
        continue;
      }
      futexWait(w, v, 2000);
      auto now = Clock::now();
      if (now < next_check) continue;
      next_check = now + kLivenessCheck;
      if (stopped_.load()) throw TransportError(c10::str("vccl: ", describe(op), " interrupted: shut down"), true);
      if (!processAlive(pids_[r])) {
        throw TransportError(c10::str("vccl: ", describe(op), " failed: rank ", r, " (pid ", pids_[r],
                                      ") exited while this rank waited for it (shared memory transport)"),
                             true);
      }
      if (now > deadline) {
        throw TransportError(c10::str("vccl: ", describe(op), " timed out after ", op.timeout.count(),
                                      " ms waiting for rank ", r, " to ", done ? "finish" : "reach", " it "
                                      "(shared memory transport); that rank may be stuck or not call this "
                                      "collective"),
                             true);
      }
    }
  }
}

void ShmTransport::start(const OpPtr& op) {
  if (op->type == OpType::SEND || op->type == OpType::RECV || op->type == OpType::RECVANYSOURCE ||
      (op->type == OpType::BARRIER && op->monitored)) {
    gloo_->start(op);
    return;
  }
  if (op->type == OpType::COALESCED) {
    bool p2p = false;
    for (const auto& m : op->batch) p2p = p2p || m->type == OpType::SEND || m->type == OpType::RECV;
    if (p2p) {
      gloo_->start(op);  // posts the transfers and runs the batch's collectives over Gloo
      return;
    }
    for (const auto& m : op->batch) {
      runCollective(*m);
      m->finish();
    }
    op->finish();
    return;
  }
  runCollective(*op);
  op->finish();
}

void ShmTransport::runCollective(CollectiveOp& op) {
  if (stopped_.load()) throw TransportError("vccl: the process group was shut down", true);
  const int W = world_, me = rank_;
  const size_t nin = op.inputs.size(), nbuf = op.inputs.size() + op.outputs.size();
  if (nbuf > static_cast<size_t>(kMaxBufs)) {
    throw TransportError(c10::str("vccl: ", describe(op), " has ", nbuf, " tensors; the shared memory transport "
                                  "takes at most ", kMaxBufs, " per call (split the call)"),
                         false);
  }
  const uint32_t seq = static_cast<uint32_t>(op.seq);
  Ctrl* mine = ctrl(me);
  // 1. Publish (this rank's device memory first, the first time).
  std::string export_error;
  if (nbuf > 0 && op.device >= 0 && op.device < kMaxDevices && mine->anchor[op.device] == 0) {
    const DeviceExport& e = deviceExport(op.device);
    if (e.anchor != 0) {
      mine->handle[op.device] = e.handle;
      mine->anchor[op.device] = e.anchor;
    } else {
      export_error = e.error;
    }
  }
  mine->seq = op.seq;
  mine->device = op.device;
  mine->nbuf = static_cast<int32_t>(nbuf);
  for (size_t i = 0; i < nbuf; ++i) mine->ptr[i] = addressOf(i < nin ? op.inputs[i] : op.outputs[i - nin]);
  mine->factor = op.premul_factor;
  if (op.reduce_op == ReduceOp::PREMUL_SUM && op.premul_tensor.defined) {
    at::vnpu::AliasContext ctx;
    mine->factor = ctx.make(op.premul_tensor).to(at::kDouble).item<double>();
  }
  auto fp = fingerprint(op, me, W);
  std::copy(fp.begin(), fp.end(), mine->fp);
  mine->posted.store(seq, std::memory_order_release);
  futexWakeAll(&mine->posted);

  // Whatever happens next, peers must not wait for this rank's `done` forever.
  // Leaving without doing this rank's share (a timeout, an error) marks the
  // collective aborted first: a peer that arrives late must not take `done`
  // for a finished collective and return a partial result.
  struct Done {
    Ctrl* c;
    uint32_t seq;
    bool set = false;
    bool completed = false;
    void mark() {
      if (set) return;
      set = true;
      if (!completed) c->aborted.store(seq, std::memory_order_release);
      c->done.store(seq, std::memory_order_release);
      futexWakeAll(&c->done);
    }
    ~Done() { mark(); }
  } done{mine, seq};
  auto check_aborted = [&] {
    for (int r = 0; r < W; ++r) {
      if (r != me && ctrl(r)->aborted.load(std::memory_order_acquire) == seq) {
        throw TransportError(c10::str("vccl: ", describe(op), " failed: rank ", r, " gave up on it (timed out or "
                                      "failed) before this rank arrived; the result would be partial"),
                             true);
      }
    }
  };

  if (!export_error.empty()) throw TransportError(c10::str("vccl: ", describe(op), ": ", export_error), true);

  // 2. Wait for every rank's inputs.
  waitAll(false, seq, op);
  check_aborted();
  for (int r = 0; r < W; ++r) {
    if (ctrl(r)->seq != op.seq) {
      throw TransportError(c10::str("vccl: ", describe(op), ": rank ", r, " published collective #", ctrl(r)->seq,
                                    "; the ranks disagree about which collective runs"),
                           true);
    }
  }
  // 3. Check the arguments of every rank.
  if (check_args_) {
    const size_t len = fingerprintLength(W);
    std::vector<int64_t> all(len * W);
    for (int r = 0; r < W; ++r) std::copy(ctrl(r)->fp, ctrl(r)->fp + len, all.begin() + r * len);
    std::string msg = checkFingerprints(op, me, W, all.data());
    if (!msg.empty()) {
      done.completed = true;  // every rank finds the same mismatch and raises it: not an abort
      done.mark();
      waitAll(true, seq, op);
      throw TransportError(msg, false);
    }
  }
  // 4. This rank's share of the work. ptr(r, i): rank r's buffer i, in this process.
  auto ptr = [&](int r, size_t i) { return local(r, ctrl(r)->device, ctrl(r)->ptr[i]); };
  std::vector<double> factors(W);
  for (int r = 0; r < W; ++r) factors[r] = ctrl(r)->factor;
  std::vector<void*> dsts(W);
  std::vector<const void*> srcs(W);
  switch (op.type) {
    case OpType::BARRIER:
      break;
    case OpType::ALLREDUCE:
    case OpType::ALLREDUCE_COALESCED:
      for (size_t k = 0; k < nin; ++k) {
        const size_t item = c10::elementSize(op.inputs[k].dtype);
        auto [lo, hi] = sliceOf(numelOf(op.inputs[k]), item, me, W);
        if (hi <= lo) continue;
        for (int r = 0; r < W; ++r) {
          dsts[r] = ptr(r, k) + lo * item;
          srcs[r] = dsts[r];
        }
        reduce(dsts.data(), W, srcs.data(), W, hi - lo, op.inputs[k].dtype, op.reduce_op, factors.data());
      }
      break;
    case OpType::REDUCE: {
      const size_t item = c10::elementSize(op.inputs[0].dtype);
      auto [lo, hi] = sliceOf(numelOf(op.inputs[0]), item, me, W);
      if (hi > lo) {
        for (int r = 0; r < W; ++r) srcs[r] = ptr(r, 0) + lo * item;
        void* dst = ptr(static_cast<int>(op.root), 0) + lo * item;
        reduce(&dst, 1, srcs.data(), W, hi - lo, op.inputs[0].dtype, op.reduce_op, factors.data());
      }
      break;
    }
    case OpType::BROADCAST:
      if (me != op.root)
        for (size_t k = 0; k < nin; ++k) copyIfDistinct(ptr(me, k), ptr(static_cast<int>(op.root), k), nbytesOf(op.inputs[k]));
      break;
    case OpType::_ALLGATHER_BASE:
      for (size_t k = 0; k < nin; ++k) {
        const int64_t n = nbytesOf(op.inputs[k]);
        for (int r = 0; r < W; ++r) copyIfDistinct(ptr(me, nin + k) + r * n, ptr(r, k), n);
      }
      break;
    case OpType::ALLGATHER:
    case OpType::ALLGATHER_COALESCED:
      for (size_t k = 0; k < nin; ++k)
        for (int r = 0; r < W; ++r)
          copyIfDistinct(ptr(me, nin + k * W + r), ptr(r, k), nbytesOf(op.outputs[k * W + r]));
      break;
    case OpType::GATHER:
      if (me == op.root)
        for (int r = 0; r < W; ++r) copyIfDistinct(ptr(me, 1 + r), ptr(r, 0), nbytesOf(op.outputs[r]));
      break;
    case OpType::SCATTER:
      copyIfDistinct(ptr(me, nin), ptr(static_cast<int>(op.root), me), nbytesOf(op.outputs[0]));
      break;
    case OpType::REDUCE_SCATTER: {
      void* dst = ptr(me, nin);
      for (int r = 0; r < W; ++r) srcs[r] = ptr(r, me);
      reduce(&dst, 1, srcs.data(), W, numelOf(op.outputs[0]), op.outputs[0].dtype, op.reduce_op, factors.data());
      break;
    }
    case OpType::_REDUCE_SCATTER_BASE:
    case OpType::REDUCE_SCATTER_TENSOR_COALESCED:
      for (size_t k = 0; k < nin; ++k) {
        const int64_t n = nbytesOf(op.outputs[k]);
        void* dst = ptr(me, nin + k);
        for (int r = 0; r < W; ++r) srcs[r] = ptr(r, k) + me * n;
        reduce(&dst, 1, srcs.data(), W, numelOf(op.outputs[k]), op.outputs[k].dtype, op.reduce_op, factors.data());
      }
      break;
    case OpType::ALLTOALL_BASE: {
      const TensorSpec& out = op.outputs[0];
      const int64_t rows = out.sizes.empty() ? 1 : out.sizes[0];
      const int64_t row_bytes = rows == 0 ? 0 : nbytesOf(out) / rows;
      int64_t out_off = 0;
      for (int r = 0; r < W; ++r) {
        const int64_t* sends = fingerprintSendCounts(ctrl(r)->fp);  // rows rank r sends to each rank
        int64_t in_off = 0;
        for (int d = 0; d < me; ++d) in_off += sends[d];
        copyIfDistinct(ptr(me, 1) + out_off * row_bytes, ptr(r, 0) + in_off * row_bytes, sends[me] * row_bytes);
        out_off += sends[me];
      }
      break;
    }
    case OpType::ALLTOALL:
      for (int r = 0; r < W; ++r) copyIfDistinct(ptr(me, W + r), ptr(r, me), nbytesOf(op.outputs[r]));
      break;
    default:
      throw TransportError(c10::str("vccl: ", describe(op), ": not a shared-memory collective"), true);
  }
  // 5. Done when every rank is done with every buffer.
  done.completed = true;
  done.mark();
  waitAll(true, seq, op);
  check_aborted();
}

}  // namespace c10d::vnpu
