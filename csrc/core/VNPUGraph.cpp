#include "VNPUGraph.h"

#include "VNPUCachingAllocator.h"
#include "VNPUException.h"
#include "VNPUFunctions.h"
#include "VNPUStream.h"

#include <ATen/core/GraphImplInterface.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace at::vnpu {
namespace {

constexpr DeviceType kVNPU = DeviceType::PrivateUse1;

// Pool ids as CUDA hands them out: {0, n} from graph_pool_handle(), {n, 0} for a graph's own pool.
std::atomic<c10::CaptureId_t> g_next_pool_uid{1};

vnpuStreamCaptureMode runtime_mode(GraphCaptureMode mode) {
  switch (mode) {
    case GraphCaptureMode::ThreadLocal: return vnpuStreamCaptureModeThreadLocal;
    case GraphCaptureMode::Relaxed: return vnpuStreamCaptureModeRelaxed;
    case GraphCaptureMode::Default:  // CUDA's default (torch.cuda.graph's "global")
    case GraphCaptureMode::Global: return vnpuStreamCaptureModeGlobal;
  }
  return vnpuStreamCaptureModeGlobal;
}

class VNPUGraphImpl;

// Capturing graphs by capture stream, for the executor's random ops: See Note [Random numbers in graphs].
std::atomic<int> g_capturing{0};
std::mutex g_capturing_mu;  // guards g_by_stream
std::map<vnpuStream_t, VNPUGraphImpl*> g_by_stream;

uint64_t rounded_increment(uint64_t increment) {  // as VNPUGeneratorImpl::philox_engine_inputs
  increment = (increment + 3) / 4 * 4;
  return increment == 0 ? 4 : increment;
}

class VNPUGraphImpl final : public GraphImplInterface {
 public:
  explicit VNPUGraphImpl(const GraphImplArgs& args) : keep_graph_(args.keep_graph) {}
  ~VNPUGraphImpl() override {
    try {
      reset();
    } catch (...) {
      // never throw from a destructor (reset() only fails on runtime misuse)
    }
  }
  VNPUGraphImpl(const VNPUGraphImpl&) = delete;
  VNPUGraphImpl& operator=(const VNPUGraphImpl&) = delete;

  void capture_begin(MempoolId_t pool, GraphCaptureMode capture_mode) override {
    TORCH_CHECK(!capturing_ && !has_graph_ && !has_graph_exec_,
                "This VNPUGraph instance already owns a captured graph. To capture a new graph, create a new "
                "instance or call reset() first.");
    const DeviceIndex dev = c10::vnpu::current_device();
    auto stream = c10::vnpu::getCurrentVNPUStream(dev);
    TORCH_CHECK(stream != c10::vnpu::getDefaultVNPUStream(dev),
                "vnpu graphs must be captured on a non-default stream, as CUDA graphs. (However, after capture, "
                "it's ok to replay them on the default stream.) Use `with torch.vnpu.graph(g):`, which captures "
                "on a side stream, or make a torch.vnpu.Stream() current first.");
    if (pool.first != 0 || pool.second != 0) {
      TORCH_CHECK(!(pool.first != 0 && pool.second != 0), "invalid graph pool id (", pool.first, ", ", pool.second,
                  "): pass torch.vnpu.graph_pool_handle() or another graph's pool()");
      mempool_id_ = pool;  // shared with other graphs
    } else {
      mempool_id_ = {g_next_pool_uid.fetch_add(1), 0};
    }
    vnpuStream_t raw = stream.stream();
    // The capturing stream and the streams that join its capture (Note [Cross-stream capture], runtime graph.cpp).
    auto capture_id = std::make_shared<std::atomic<unsigned long long>>(0);
    c10::vnpu::allocator::beginAllocateToPool(dev, mempool_id_, [raw, capture_id](vnpuStream_t s) {
      if (s == raw) return true;
      vnpuStreamCaptureStatus status = vnpuStreamCaptureStatusNone;
      unsigned long long id = 0;
      return vnpuStreamGetCaptureInfo(s, &status, &id) == vnpuSuccess && status != vnpuStreamCaptureStatusNone &&
             id == capture_id->load();
    });
    {
      std::lock_guard<std::mutex> g(g_capturing_mu);
      g_by_stream[raw] = this;
      g_capturing.fetch_add(1);
    }
    vnpuError_t err = vnpuStreamBeginCapture(raw, runtime_mode(capture_mode));
    if (err != vnpuSuccess) {
      stop_routing(dev, raw);
      c10::vnpu::allocator::releasePool(dev, mempool_id_);
      VNPU_CHECK(err);
    }
    vnpuStreamCaptureStatus status = vnpuStreamCaptureStatusNone;
    unsigned long long id = 0;
    VNPU_CHECK(vnpuStreamGetCaptureInfo(raw, &status, &id));
    capture_id->store(id);
    capture_id_.store(id);
    capture_dev_ = dev;
    capture_stream_ = stream;
    capturing_ = true;
  }

  void capture_end() override {
    TORCH_CHECK(capturing_, "capture_end() called without a capture in progress: call capture_begin() first");
    auto stream = c10::vnpu::getCurrentVNPUStream(capture_dev_);
    TORCH_CHECK(stream == *capture_stream_, "Capture must end on the same stream it began on (", *capture_stream_,
                "), but the current stream is ", stream);
    capturing_ = false;
    vnpuStream_t raw = capture_stream_->stream();
    stop_routing(capture_dev_, raw);
    vnpuGraph_t g = nullptr;
    vnpuError_t err = vnpuStreamEndCapture(raw, &g);
    if (err != vnpuSuccess) {
      // Nothing was captured: the pool goes back (memory at the next empty_cache), the object is reusable.
      c10::vnpu::allocator::releasePool(capture_dev_, mempool_id_);
      rng_.clear();
      capture_stream_.reset();
      VNPU_CHECK(err);
    }
    graph_ = g;
    has_graph_ = true;
    pool_held_ = true;
    size_t nodes = 0;
    VNPU_CHECK(vnpuGraphGetNodeCount(graph_, &nodes));
    if (nodes == 0) {
      TORCH_WARN("The vnpu graph is empty: no work was enqueued on the capture stream between capture_begin() and "
                 "capture_end(). Ops on other streams are not captured.");
    }
    if (!keep_graph_) {
      instantiate();
      if (!debug_) {
        VNPU_CHECK(vnpuGraphDestroy(graph_));
        graph_ = nullptr;
        has_graph_ = false;
      }
    }
  }

  void instantiate() override {
    TORCH_CHECK(has_graph_, "instantiate() needs a captured graph: capture one first (an instance made with "
                            "keep_graph=False instantiates at capture_end())");
    if (has_graph_exec_) {
      VNPU_CHECK(vnpuGraphExecDestroy(exec_));
      exec_ = nullptr;
      has_graph_exec_ = false;
    }
    VNPU_CHECK(vnpuGraphInstantiate(&exec_, graph_, 0));
    has_graph_exec_ = true;
  }

  void replay() override {
    TORCH_CHECK(has_graph_exec_ || has_graph_, "Called VNPUGraph::replay without a preceding successful capture.");
    if (!has_graph_exec_) instantiate();  // keep_graph=True: instantiated at the first replay
    c10::DeviceGuard guard(Device(kVNPU, capture_dev_));
    auto stream = c10::vnpu::getCurrentVNPUStream(capture_dev_);
    if (!rng_.empty()) {
      // See Note [Random numbers in graphs]: the bases for this replay, in stream order.
      std::vector<std::pair<std::shared_ptr<PhiloxBase>, std::pair<uint64_t, uint64_t>>> bases;
      for (auto& use : rng_) {
        auto* gen = static_cast<VNPUGeneratorImpl*>(use.gen.get());
        std::lock_guard<std::mutex> lock(gen->mutex_);
        bases.emplace_back(use.base, gen->philox_engine_inputs(use.increment));
      }
      VNPU_CHECK(vnpuLaunchKernel(stream.stream(), "graph rng state", [bases = std::move(bases)] {
        for (const auto& [base, state] : bases) {
          base->seed = state.first;
          base->offset = state.second;
        }
      }));
    }
    VNPU_CHECK(vnpuGraphLaunch(exec_, stream.stream()));
  }

  void reset() override {
    if (capturing_) {  // abandon the capture: the stream must not stay capturing
      capturing_ = false;
      vnpuStream_t raw = capture_stream_->stream();
      stop_routing(capture_dev_, raw);
      vnpuGraph_t g = nullptr;
      if (vnpuStreamEndCapture(raw, &g) == vnpuSuccess) vnpuGraphDestroy(g);
      pool_held_ = true;
    }
    if (has_graph_) vnpuGraphDestroy(graph_);
    if (has_graph_exec_) vnpuGraphExecDestroy(exec_);  // queued replays keep what they need
    graph_ = nullptr;
    exec_ = nullptr;
    has_graph_ = has_graph_exec_ = false;
    if (pool_held_) {
      c10::vnpu::allocator::releasePool(capture_dev_, mempool_id_);
      pool_held_ = false;
    }
    rng_.clear();
    capture_stream_.reset();
  }

  MempoolId_t pool() const override {
    TORCH_CHECK(pool_held_ || capturing_, "Called VNPUGraph::pool() without a preceding successful capture.");
    return mempool_id_;
  }

  void enable_debug_mode() override { debug_ = true; }

  void debug_dump(const std::string& path) override {
    if (!(debug_ || keep_graph_)) {
      TORCH_WARN("vnpu graph debugging is not enabled: call enable_debug_mode() before capturing, or capture "
                 "with keep_graph=True");
      return;
    }
    TORCH_CHECK(has_graph_, "debug_dump: no captured graph to dump (capture one first)");
    VNPU_CHECK(vnpuGraphDebugDotPrint(graph_, path.c_str()));
  }

  // See Note [Random numbers in graphs]. Called with g_capturing_mu held.
  void philox_inputs(VNPUGeneratorImpl* gen, uint64_t increment, std::shared_ptr<PhiloxBase>* base,
                     uint64_t* offset) {
    for (auto& use : rng_) {
      if (use.gen.get() == gen) {
        *base = use.base;
        *offset = use.increment;
        use.increment += rounded_increment(increment);
        return;
      }
    }
    RngUse use;
    use.gen = c10::intrusive_ptr<c10::GeneratorImpl>::reclaim_copy(gen);
    use.base = std::make_shared<PhiloxBase>();
    use.increment = rounded_increment(increment);
    *base = use.base;
    *offset = 0;
    rng_.push_back(std::move(use));
  }

 private:
  void stop_routing(DeviceIndex dev, vnpuStream_t raw) {
    c10::vnpu::allocator::endAllocateToPool(dev, mempool_id_);
    std::lock_guard<std::mutex> g(g_capturing_mu);
    auto it = g_by_stream.find(raw);
    if (it != g_by_stream.end() && it->second == this) {
      g_by_stream.erase(it);
      g_capturing.fetch_sub(1);
    }
  }

  struct RngUse {
    c10::intrusive_ptr<c10::GeneratorImpl> gen;
    std::shared_ptr<PhiloxBase> base;
    uint64_t increment = 0;  // values the graph draws from `gen` per replay
  };

  const bool keep_graph_;
  bool debug_ = false;
  bool capturing_ = false;
  bool has_graph_ = false;       // graph_ is valid
  bool has_graph_exec_ = false;  // exec_ is valid
  bool pool_held_ = false;       // this graph holds mempool_id_ (releasePool at reset)
  vnpuGraph_t graph_ = nullptr;
  vnpuGraphExec_t exec_ = nullptr;
  MempoolId_t mempool_id_{0, 0};
  DeviceIndex capture_dev_ = -1;
  std::optional<c10::vnpu::VNPUStream> capture_stream_;
  std::vector<RngUse> rng_;

 public:
  std::atomic<unsigned long long> capture_id_{0};  // the runtime's id of the capture underway
};

}  // namespace

bool graph_philox_inputs(VNPUGeneratorImpl* gen, DeviceIndex device, uint64_t increment,
                         std::shared_ptr<PhiloxBase>* base, uint64_t* offset) {
  if (g_capturing.load(std::memory_order_relaxed) == 0) return false;
  vnpuStream_t raw = c10::vnpu::getCurrentVNPUStream(device).stream();
  std::lock_guard<std::mutex> g(g_capturing_mu);
  auto it = g_by_stream.find(raw);
  VNPUGraphImpl* graph = it != g_by_stream.end() ? it->second : nullptr;
  if (graph == nullptr) {  // a stream that joined a capture (Note [Cross-stream capture], runtime graph.cpp)
    vnpuStreamCaptureStatus status = vnpuStreamCaptureStatusNone;
    unsigned long long id = 0;
    if (vnpuStreamGetCaptureInfo(raw, &status, &id) != vnpuSuccess || status == vnpuStreamCaptureStatusNone)
      return false;
    for (const auto& [stream, g] : g_by_stream) {
      if (g->capture_id_.load() == id) graph = g;
    }
    if (graph == nullptr) return false;
  }
  graph->philox_inputs(gen, increment, base, offset);
  return true;
}

c10::MempoolId_t graph_pool_handle() { return {0, g_next_pool_uid.fetch_add(1)}; }

bool is_current_stream_capturing() {
  if (c10::vnpu::device_count() == 0) return false;
  vnpuStreamCaptureStatus status = vnpuStreamCaptureStatusNone;
  VNPU_CHECK(vnpuStreamIsCapturing(c10::vnpu::getCurrentVNPUStream().stream(), &status));
  return status != vnpuStreamCaptureStatusNone;
}

void register_graph_impl() {
  // The registry's key is the device type's name as torch.accelerator.Graph looks it up (after the rename).
  const std::string key = c10::DeviceTypeName(kVNPU, /*lower_case=*/false);
  if (GraphImplRegistry()->Has(key)) return;
  GraphImplRegistry()->Register(key, [](GraphImplArgs args) -> std::unique_ptr<GraphImplInterface> {
    return std::make_unique<VNPUGraphImpl>(args);
  });
}

}  // namespace at::vnpu
