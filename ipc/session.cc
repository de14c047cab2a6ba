#include "ipc/session.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include <kj/exception.h>

#include "ipc/fetch_sender.h"
#include "ipc/wire.h"

namespace primecache::ipc {

using wire::ErrorCode;

// ---- per-publish and per-fetch state ---------------------------------------

struct Session::Publish {
  std::uint64_t id = 0;
  PublishRequest key;
  std::uint32_t layer_count = 0;

  // Protocol position, loop thread only.
  std::uint32_t layers_begun = 0;
  std::uint32_t chunks_expected = 0;  // of the current layer
  std::uint32_t chunks_seen = 0;
  // Chunk bytes received (loop thread; the commit's op, queued after every
  // chunk's under `mu`, reads it) and when publishBegin arrived: metrics.
  std::uint64_t chunk_bytes = 0;
  const std::chrono::steady_clock::time_point begun = std::chrono::steady_clock::now();

  // Applied in order on workers.
  Mutex mu;
  std::deque<std::function<void()>> ops GUARDED_BY(mu);
  bool running GUARDED_BY(mu) = false;
  // Worker side (touched by one op at a time).
  std::unique_ptr<PublishSink> sink;
  Status failed;
  bool finished = false;

  // Bytes counted against the uncommitted bounds (released when finished).
  std::atomic<std::uint64_t> reserved{0};
  // When data last arrived for it or an op of it was applied (steady ns).
  std::atomic<std::int64_t> progress_ns{0};
  std::atomic<std::uint32_t> ops_pending{0};  // queued or running
};

namespace {

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Copies capnp text out, bounded.
Result<std::string> ReadText(capnp::Text::Reader t, std::size_t max, const char* what) {
  if (t.size() > max) return Status::InvalidArgument(std::string(what) + " longer than " + std::to_string(max) + " bytes");
  return std::string(t.cStr(), t.size());
}

std::span<const std::byte> AsBytes(capnp::Data::Reader d) {
  return {reinterpret_cast<const std::byte*>(d.begin()), d.size()};
}

// Counts what a fetch streams (Verify reads every chunk, checked, and keeps nothing).
class CountingSink : public FetchSink {
 public:
  Status OnLayer(std::uint32_t, std::string_view header, std::uint32_t) override {
    ++layers;
    bytes += header.size();
    return Status::Ok();
  }
  Status OnChunk(std::uint32_t, std::uint32_t, std::span<const std::byte> b) override {
    bytes += b.size();
    return Status::Ok();
  }
  std::uint32_t layers = 0;
  std::uint64_t bytes = 0;
};

// Why chunk `index` of layer `layer` is out of publish `pub`'s order.
std::string ChunkOrderError(const Session::Publish& pub, std::uint32_t layer, std::uint32_t index) {
  const std::string got = "chunk " + std::to_string(index) + " of layer " + std::to_string(layer);
  if (pub.layers_begun == 0) return "chunk out of order: " + got + " before any publishLayer";
  const std::string current = std::to_string(pub.layers_begun - 1);
  if (pub.chunks_seen >= pub.chunks_expected) {
    return "chunk out of order: " + got + ", but layer " + current + " announced " +
           std::to_string(pub.chunks_expected) + " chunk(s) and all of them were sent";
  }
  return "chunk out of order: expected chunk " + std::to_string(pub.chunks_seen) + " of layer " + current + ", got " + got;
}

}  // namespace

Session::Session(StoreBackend* store, Executor* executor, Executor* fetch_executor,
                 std::shared_ptr<ResponseSink> sink, SessionLimits limits, PeerInfo peer, ServerCounters* counters,
                 DeviceDma* device_dma)
    : store_(store), executor_(executor), fetch_executor_(fetch_executor), sink_(std::move(sink)), limits_(limits), peer_(std::move(peer)),
      counters_(counters), device_dma_(device_dma) {
  last_answer_ns_ = NowNs();
}

Session::~Session() {
  if (shm_) {
    counters_->shm_regions.fetch_sub(1, std::memory_order_relaxed);
    counters_->shm_bytes.fetch_sub(shm_->size(), std::memory_order_relaxed);
  }
}

void Session::Serve(Executor* executor, std::function<void()> job) {
  jobs_in_flight_.fetch_add(1);
  executor->Post([self = shared_from_this(), job = std::move(job)] {
    job();
    self->last_answer_ns_ = NowNs();
    self->jobs_in_flight_.fetch_sub(1);
  });
}

bool Session::Busy() const {
  if (jobs_in_flight_.load() != 0) return true;
  MutexLock l(&mu_);
  return publishes_open_ != 0 || !fetches_.empty();
}

std::chrono::steady_clock::time_point Session::last_answer() const {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(last_answer_ns_.load()));
}

Status Session::ReserveUncommitted(Publish& pub, std::size_t bytes) {
  MutexLock l(&mu_);
  if (uncommitted_ + bytes > limits_.max_uncommitted_bytes) {
    return Status::ResourceExhausted(
        "publish " + std::to_string(pub.id) + " would take this connection's uncommitted publish bytes past its limit of " +
        std::to_string(limits_.max_uncommitted_bytes) + " bytes (--max-uncommitted-per-connection); " +
        std::to_string(uncommitted_) + " are held by its open publishes");
  }
  std::uint64_t total = counters_->uncommitted_bytes.load();
  do {
    if (total + bytes > limits_.max_uncommitted_total_bytes) {
      return Status::ResourceExhausted("publish " + std::to_string(pub.id) +
                                       " would take the daemon's uncommitted publish bytes past its limit of " +
                                       std::to_string(limits_.max_uncommitted_total_bytes) +
                                       " bytes (--max-uncommitted-total); " + std::to_string(total) +
                                       " are held by open publishes");
    }
  } while (!counters_->uncommitted_bytes.compare_exchange_weak(total, total + bytes));
  uncommitted_ += bytes;
  pub.reserved += bytes;
  return Status::Ok();
}

void Session::ReleaseUncommitted(Publish& pub) {
  const std::uint64_t bytes = pub.reserved.exchange(0);
  if (bytes == 0) return;
  counters_->uncommitted_bytes.fetch_sub(bytes);
  MutexLock l(&mu_);
  uncommitted_ -= std::min(bytes, uncommitted_);
}

void Session::ExpireStalledPublishes(std::chrono::steady_clock::time_point now) {
  if (limits_.publish_timeout.count() <= 0) return;
  const std::int64_t limit_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(limits_.publish_timeout).count();
  const std::int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  std::vector<std::shared_ptr<Publish>> stalled;
  {
    MutexLock l(&mu_);
    for (auto it = publishes_.begin(); it != publishes_.end();) {
      const Publish& p = *it->second;
      // Ops queued or running: the daemon, not the client, is behind.
      if (p.ops_pending.load() == 0 && now_ns - p.progress_ns.load() >= limit_ns) {
        stalled.push_back(it->second);
        it = publishes_.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& p : stalled) {
      expired_.emplace_back(p->id, "publish " + std::to_string(p->id) + " was aborted: nothing arrived for it for " +
                                       std::to_string(limits_.publish_timeout.count()) + " ms (--publish-timeout)");
      if (expired_.size() > kExpiredKept) expired_.pop_front();
    }
  }
  for (const auto& p : stalled) {
    spdlog::info("primecached: publish {} of uid {} made no progress for {} ms; aborted", p->id, peer_.uid,
                 limits_.publish_timeout.count());
    sink_->Send(ErrorResponse(0, ErrorCode::DEADLINE_EXCEEDED, ExpiredReason(p->id)));
    RunPublishOp(p, 0, [this, p] { FinishPublish(p); });
  }
}

std::string Session::ExpiredReason(std::uint64_t publish) const {
  MutexLock l(&mu_);
  for (const auto& [id, why] : expired_) {
    if (id == publish) return why;
  }
  return "";
}

void Session::SendError(std::uint64_t id, const Status& s) { sink_->Send(ErrorResponse(id, s)); }

void Session::SendProtocolError(std::uint64_t id, const std::string& msg) {
  sink_->Send(ErrorResponse(id, ErrorCode::PROTOCOL, msg));
}

bool Session::InboundBlocked() const {
  MutexLock l(&mu_);
  return backlog_bytes_ > limits_.max_publish_backlog_bytes;
}

void Session::ReleaseBacklog(std::size_t bytes) {
  std::function<void()> cb;
  {
    MutexLock l(&mu_);
    const bool was_blocked = backlog_bytes_ > limits_.max_publish_backlog_bytes;
    backlog_bytes_ -= std::min(bytes, backlog_bytes_);
    if (was_blocked && backlog_bytes_ <= limits_.max_publish_backlog_bytes) cb = unblocked_cb_;
  }
  if (cb) cb();
}

void Session::RunPublishOp(const std::shared_ptr<Publish>& pub, std::size_t bytes, std::function<void()> op) {
  if (bytes != 0) {
    MutexLock l(&mu_);
    backlog_bytes_ += bytes;
  }
  bool start = false;
  pub->ops_pending.fetch_add(1);
  {
    MutexLock l(&pub->mu);
    pub->ops.push_back([this, pub, op = std::move(op), bytes] {
      op();
      // Finished and its answers sent: a later step need not queue behind it.
      if (pub->finished) ForgetEnded(*pub);
      if (bytes != 0) ReleaseBacklog(bytes);
      pub->progress_ns = NowNs();
      pub->ops_pending.fetch_sub(1);
    });
    if (!pub->running) start = pub->running = true;
  }
  if (!start) return;
  executor_->Post([self = shared_from_this(), pub] {
    for (;;) {
      std::function<void()> next;
      {
        MutexLock l(&pub->mu);
        if (pub->ops.empty()) {
          pub->running = false;
          return;
        }
        next = std::move(pub->ops.front());
        pub->ops.pop_front();
      }
      next();
    }
  });
}

void Session::ForgetEnded(const Publish& pub) {
  MutexLock l(&mu_);
  auto it = ending_.find(pub.id);
  if (it != ending_.end() && it->second.get() == &pub) ending_.erase(it);
}

void Session::FailPublish(const std::shared_ptr<Publish>& pub, std::uint64_t id, Status s) {
  // Worker side. The store's staging of it, and its count against the
  // uncommitted bounds, go now rather than when the client gives up on it.
  pub->failed = std::move(s);
  // Admission's refusal (aborted before the store opened a sink) is the
  // policy at work, not a failure; the store counts it (admission_refusals).
  if (pub->sink || pub->failed.code() != StatusCode::kAborted) {
    counters_->publish_errors.fetch_add(1, std::memory_order_relaxed);
  }
  if (pub->sink) {
    pub->sink->Abort();
    pub->sink.reset();
  }
  ReleaseUncommitted(*pub);
  SendError(id, pub->failed);
}

void Session::FinishPublish(const std::shared_ptr<Publish>& pub) {
  // Worker side, inside the publish's serial queue.
  if (pub->finished) return;
  pub->finished = true;
  if (pub->sink) {
    pub->sink->Abort();  // no-op after a commit
    pub->sink.reset();
  }
  ReleaseUncommitted(*pub);
  counters_->publishes_in_flight.fetch_sub(1);
  MutexLock l(&mu_);
  --publishes_open_;
}

bool Session::OpenWindows(std::uint64_t id, wire::Fetch::Reader f, FetchState& st) {
  if (f.hasShmWindow() && f.getShmWindow().getLength() != 0) {
    auto w = f.getShmWindow();
    if (!shm_) {
      SendError(id, Status::FailedPrecondition("no shared region attached"));
      return false;
    }
    if (!shm_->Contains(w.getOffset(), w.getLength())) {
      SendError(id, Status::InvalidArgument("fetch window outside the shared region"));
      return false;
    }
    st.shm = shm_;
    st.shm_ring.Open(w.getOffset(), w.getLength(), &counters_->shm_bytes_in_use, &counters_->fetch_window_waits);
  }
  if (f.hasDeviceWindow() && f.getDeviceWindow().getLength() != 0) {
    auto w = f.getDeviceWindow();
    std::shared_ptr<DeviceWindow> device;
    {
      MutexLock l(&mu_);
      device = device_;
    }
    if (!device) {
      SendError(id, Status::FailedPrecondition("no device window attached (attachDevice)"));
      return false;
    }
    if (w.getOffset() > device->size() || w.getLength() > device->size() - w.getOffset()) {
      SendError(id, Status::InvalidArgument("fetch device window outside the attached window of " +
                                            std::to_string(device->size()) + " bytes"));
      return false;
    }
    st.device = std::move(device);
    st.device_ring.Open(w.getOffset(), w.getLength(), nullptr, &counters_->fetch_window_waits);
  }
  return true;
}

void Session::AttachDevice(std::uint64_t id, wire::AttachDevice::Reader a) {
  // The request is checked first, so a malformed one is told so by any daemon.
  auto bus = ReadText(a.getPciBusId(), 64, "PCI bus id");
  if (!bus.ok()) return SendError(id, bus.status());
  if (a.getHandle().size() != kDeviceHandleBytes) {
    return SendError(id, Status::InvalidArgument("device handle of " + std::to_string(a.getHandle().size()) +
                                                 " bytes, not " + std::to_string(kDeviceHandleBytes)));
  }
  if (a.getSize() == 0) return SendError(id, Status::InvalidArgument("device window of 0 bytes"));
  if (device_dma_ == nullptr) {
    return SendError(id, Status::NotSupported("this daemon makes no device copies (--device-copies off, no CUDA "
                                              "device, or built without CUDA); fetch through shared memory"));
  }
  if (!peer_.local) return SendError(id, Status::NotSupported("device windows need a Unix socket"));
  DeviceWindowSpec spec{std::move(*bus), std::string(reinterpret_cast<const char*>(a.getHandle().begin()),
                                                     a.getHandle().size()),
                        a.getSize()};
  Serve(executor_, [this, id, spec = std::move(spec)] {
    auto w = device_dma_->Open(spec);
    if (!w.ok()) {
      // Whatever the driver says, the handle named nothing this daemon can use.
      return SendError(id, Status::InvalidArgument("attachDevice: " + w.status().ToString()));
    }
    {
      MutexLock l(&mu_);
      device_ = std::move(w).value();  // fetches streaming keep the window they began with
    }
    sink_->Send(BuildResponse(id, [](wire::Response::Builder r) { r.setAck(); }));
  });
}

void Session::ReleaseWindow(std::uint64_t id, bool device, std::uint64_t offset, std::uint64_t length) {
  std::vector<std::shared_ptr<FetchState>> candidates;
  {
    MutexLock l(&mu_);
    for (auto& [fid, f] : fetches_) {
      const WindowRing& ring = device ? f->device_ring : f->shm_ring;
      if (ring.open() && offset >= ring.offset() && offset - ring.offset() < ring.length()) candidates.push_back(f);
    }
  }
  if (candidates.empty()) return;  // the fetch has ended; nothing to free
  // Device windows of fetches begun before and after a second attach may
  // share offsets: the release is the one fetch's whose chunk it names.
  for (auto& f : candidates) {
    WindowRing& ring = device ? f->device_ring : f->shm_ring;
    if (ring.Release(offset - ring.offset(), length)) return;
  }
  SendProtocolError(id, std::string(device ? "deviceRelease" : "shmRelease") +
                            " names no chunk sent and not yet released: release each chunk once, as it arrived");
}

bool Session::AcceptNamespace(std::uint64_t id, capnp::Text::Reader ns) {
  auto text = ReadText(ns, limits_.max_text_bytes, "namespace");
  if (!text.ok()) {
    SendError(id, text.status());
    return false;
  }
  if (!text->empty() && *text != ns_) {
    sink_->Send(ErrorResponse(id, ErrorCode::PERMISSION_DENIED, "namespace differs from the connection's"));
    return false;
  }
  return true;
}

std::optional<std::string> Session::TenantScope() const {
  if (peer_.admin) return std::nullopt;
  return ns_;
}

void Session::OnClose() {
  std::vector<std::shared_ptr<Publish>> pubs;
  std::vector<std::shared_ptr<FetchState>> fetches;
  {
    MutexLock l(&mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [id, p] : publishes_) pubs.push_back(p);
    for (auto& [id, f] : fetches_) fetches.push_back(f);
    publishes_.clear();
  }
  for (auto& f : fetches) f->Cancel();
  for (auto& p : pubs) {
    RunPublishOp(p, 0, [this, p] { FinishPublish(p); });  // abort: leaves nothing
  }
}

bool Session::OnFrame(Frame frame, std::vector<int>* fds) {
  {
    MutexLock l(&mu_);
    if (closed_) return false;
  }
  try {
    return Dispatch(frame, &frame, fds);
  } catch (const kj::Exception& e) {
    SendProtocolError(0, std::string("malformed message: ") + e.getDescription().cStr());
    return true;
  } catch (const std::exception& e) {
    SendProtocolError(0, std::string("malformed message: ") + e.what());
    return true;
  }
}

bool Session::Dispatch(const Frame& frame_ref, Frame* owned, std::vector<int>* fds) {
  auto reader = frame_ref.Reader(limits_.frame);
  {
    // Walk the whole message once: any pointer anywhere that is out of
    // bounds, too deep, or that aliases its way past the traversal budget
    // is refused here, before a field is used.
    auto any = reader->getRoot<capnp::AnyPointer>();
    (void)any.targetSize();
  }
  auto req = reader->getRoot<wire::Request>();
  const std::uint64_t id = req.getId();
  const auto which = req.which();

  if (!peer_.refused.empty()) {
    // Answered (rather than hung up on) so the peer learns why; then closed.
    sink_->Send(ErrorResponse(id, ErrorCode::PERMISSION_DENIED, peer_.refused));
    return false;
  }
  if (!hello_done_ && which != wire::Request::HELLO) {
    SendProtocolError(id, "the first request must be hello");
    return true;
  }

  const Incoming in{id, req, owned, fds};
  switch (which) {
    case wire::Request::HELLO:
      return OnHello(in);
    case wire::Request::PUBLISH_BEGIN:
      return OnPublishBegin(in);
    case wire::Request::PUBLISH_LAYER:
    case wire::Request::PUBLISH_CHUNK:
    case wire::Request::PUBLISH_COMMIT:
    case wire::Request::PUBLISH_ABORT:
      return OnPublishStep(in);
    case wire::Request::LOOKUP:
      return OnLookup(in);
    case wire::Request::FETCH:
      return OnFetch(in);
    case wire::Request::SHM_RELEASE:
      ReleaseWindow(id, false, req.getShmRelease().getOffset(), req.getShmRelease().getLength());
      return true;
    case wire::Request::DEVICE_RELEASE:
      ReleaseWindow(id, true, req.getDeviceRelease().getOffset(), req.getDeviceRelease().getLength());
      return true;
    case wire::Request::ATTACH_DEVICE:
      AttachDevice(id, req.getAttachDevice());
      return true;
    case wire::Request::CANCEL:
      return OnCancel(in);
    case wire::Request::DELETE:
    case wire::Request::SET_BYTE_BUDGET:
    case wire::Request::COMPACT:
      return OnAdminOp(in);
    case wire::Request::LIST:
      return OnList(in);
    case wire::Request::STAT:
      return OnStat(in);
    case wire::Request::DESCRIBE:
      return OnDescribe(in);
    case wire::Request::CHECK_STORE:
      return OnCheckStore(in);
    case wire::Request::CHECK_ENTRY:
      return OnCheckEntry(in);
    case wire::Request::SHM_ATTACH:
      return OnShmAttach(in);
    default:
      SendProtocolError(id, "unknown request kind " + std::to_string(static_cast<int>(which)));
      return true;
  }
}


bool Session::OnHello(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  auto h = req.getHello();
  if (hello_done_) {
    SendProtocolError(id, "hello sent twice");
    return true;
  }
  const std::uint32_t lo = std::max(h.getMinVersion(), kMinProtocolVersion);
  const std::uint32_t hi = std::min(h.getMaxVersion(), kMaxProtocolVersion);
  if (lo > hi) {
    sink_->Send(ErrorResponse(id, ErrorCode::NOT_SUPPORTED,
                              "no common protocol version: daemon speaks " + std::to_string(kMinProtocolVersion) +
                                  ".." + std::to_string(kMaxProtocolVersion)));
    return true;
  }
  auto ns = ReadText(h.getNamespace(), limits_.max_text_bytes, "namespace");
  if (!ns.ok()) {
    SendError(id, ns.status());
    return true;
  }
  if (peer_.allowed_namespaces.has_value() &&
      std::find(peer_.allowed_namespaces->begin(), peer_.allowed_namespaces->end(), *ns) ==
          peer_.allowed_namespaces->end()) {
    sink_->Send(ErrorResponse(id, ErrorCode::PERMISSION_DENIED, "namespace '" + *ns + "' is not allowed for uid " +
                                                                    std::to_string(peer_.uid)));
    return true;
  }
  ns_ = *ns;
  hello_done_ = true;
  sink_->Send(BuildResponse(id, [&](wire::Response::Builder r) {
    auto hr = r.initHello();
    hr.setVersion(hi);
    hr.setServer("primecached");
    hr.setMaxMessageBytes(limits_.frame.max_message_bytes);
    hr.setMaxChunkBytes(limits_.max_chunk_bytes);
    hr.setMaxPublishesInFlight(limits_.max_publishes_in_flight);
    hr.setAdmin(peer_.admin);
    hr.setDeviceCopies(device_dma_ != nullptr);
  }));
  return true;
}

bool Session::OnPublishBegin(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  auto pb = req.getPublishBegin();
  auto b = pb.getBoundary();
  auto fp = b.getFingerprint();
  auto name = ReadText(fp.getName(), limits_.max_text_bytes, "model name");
  if (!name.ok()) return SendError(id, name.status()), true;
  if (!AcceptNamespace(id, b.getNamespace())) return true;
  if (fp.getDescriptor().size() > limits_.max_descriptor_bytes) {
    SendError(id, Status::InvalidArgument("model descriptor over " + std::to_string(limits_.max_descriptor_bytes) +
                                          " bytes"));
    return true;
  }
  auto tokens = b.getTokens();
  if (tokens.size() == 0 || tokens.size() > limits_.max_tokens) {
    SendError(id, Status::InvalidArgument("boundary needs 1.." + std::to_string(limits_.max_tokens) + " tokens"));
    return true;
  }
  if (b.getLength() != tokens.size()) {
    SendError(id, Status::InvalidArgument("boundary length " + std::to_string(b.getLength()) + " != " +
                                          std::to_string(tokens.size()) + " tokens"));
    return true;
  }
  const std::uint32_t layer_count = pb.getLayerCount();
  if (layer_count == 0 || layer_count > limits_.max_layers) {
    SendError(id, Status::InvalidArgument("layer count must be 1.." + std::to_string(limits_.max_layers)));
    return true;
  }
  ModelCost cost;
  if (pb.hasCost()) {
    auto c = pb.getCost();
    cost = {c.getFlopsPerToken(), c.getAttentionLayers(), c.getAttentionFlopsPerPair()};
    if (cost.flops_per_token > (1ull << 50) || cost.attention_layers > layer_count ||
        cost.attention_flops_per_pair > (1ull << 40)) {
      SendError(id, Status::InvalidArgument("prefill cost out of bounds: " + std::to_string(cost.flops_per_token) +
                                            " flops a token (at most 2^50), " +
                                            std::to_string(cost.attention_layers) + " attention layers (at most " +
                                            std::to_string(layer_count) + "), " +
                                            std::to_string(cost.attention_flops_per_pair) +
                                            " flops a pair (at most 2^40)"));
      return true;
    }
  }
  auto pub = std::make_shared<Publish>();
  pub->id = id;
  pub->layer_count = layer_count;
  pub->progress_ns = NowNs();
  pub->key.model = {fp.getDigestLo(), fp.getDigestHi()};
  pub->key.model_name = std::move(*name);
  pub->key.model_descriptor.assign(reinterpret_cast<const char*>(fp.getDescriptor().begin()),
                             fp.getDescriptor().size());
  pub->key.ns = ns_;
  pub->key.tokens = ToVector(tokens);
  pub->key.cost = cost;
  {
    MutexLock l(&mu_);
    if (publishes_.count(id) != 0) {
      sink_->Send(ErrorResponse(id, ErrorCode::ALREADY_EXISTS, "a publish with this id is open"));
      return true;
    }
    if (publishes_open_ >= limits_.max_publishes_in_flight) {
      SendError(id, Status::ResourceExhausted("too many publishes in flight on this connection (limit " +
                                              std::to_string(limits_.max_publishes_in_flight) + ")"));
      return true;
    }
    ++publishes_open_;
    publishes_[id] = pub;
  }
  counters_->publishes_in_flight.fetch_add(1);
  RunPublishOp(pub, 0, [this, pub, id] {
    auto sink = store_->BeginPublish(pub->key, pub->layer_count);
    if (!sink.ok()) return FailPublish(pub, id, sink.status());
    pub->sink = std::move(sink).value();
    sink_->Send(BuildResponse(id, [](wire::Response::Builder r) { r.setAck(); }));
  });
  return true;
}

bool Session::OnPublishStep(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  const auto which = in.req.which();
  std::uint64_t pid = 0;
  if (which == wire::Request::PUBLISH_LAYER) pid = req.getPublishLayer().getPublish();
  if (which == wire::Request::PUBLISH_CHUNK) pid = req.getPublishChunk().getPublish();
  if (which == wire::Request::PUBLISH_COMMIT) pid = req.getPublishCommit().getPublish();
  if (which == wire::Request::PUBLISH_ABORT) pid = req.getPublishAbort().getPublish();
  std::shared_ptr<Publish> pub, ending;
  {
    MutexLock l(&mu_);
    auto it = publishes_.find(pid);
    if (it != publishes_.end()) pub = it->second;
    auto e = ending_.find(pid);
    if (!pub && e != ending_.end()) ending = e->second;
  }
  if (ending) {
    // Its end is still queued: this answer goes after the publish's others.
    RunPublishOp(ending, 0, [this, id, pid] { SendError(id, Status::NotFound("no open publish " + std::to_string(pid))); });
    return true;
  }
  if (!pub) {
    const std::string expired = ExpiredReason(pid);
    if (!expired.empty()) {
      sink_->Send(ErrorResponse(id, ErrorCode::DEADLINE_EXCEEDED, expired));
    } else {
      SendError(id, Status::NotFound("no open publish " + std::to_string(pid)));
    }
    return true;
  }
  pub->progress_ns = NowNs();
  // Protocol position checks happen here, so a client learns at once.
  if (which == wire::Request::PUBLISH_LAYER) return OnPublishLayer(in, pub);
  if (which == wire::Request::PUBLISH_CHUNK) return OnPublishChunk(in, pub);
  return OnPublishEnd(in, pub);
}

void Session::EndPublish(const std::shared_ptr<Publish>& pub) {
  MutexLock l(&mu_);
  publishes_.erase(pub->id);
  ending_[pub->id] = pub;
}

bool Session::AbortPublish(const std::shared_ptr<Publish>& pub, std::uint64_t id, Status s) {
  EndPublish(pub);
  // Answered from the publish's queue, after the steps before it (their
  // answers come from there), once its staged bytes are gone.
  RunPublishOp(pub, 0, [this, pub, id, s = std::move(s)] {
    FinishPublish(pub);
    SendError(id, s);
  });
  return true;
}

bool Session::OnPublishLayer(const Incoming& in, const std::shared_ptr<Publish>& pub) {
  const std::uint64_t id = in.id;
  auto pl = in.req.getPublishLayer();
  if (pub->layers_begun > 0 && pub->chunks_seen != pub->chunks_expected) {
    return AbortPublish(pub, id, Status::InvalidArgument("layer " + std::to_string(pub->layers_begun - 1) + " got " +
                                                  std::to_string(pub->chunks_seen) + " of " +
                                                  std::to_string(pub->chunks_expected) + " chunks"));
  }
  if (pub->layers_begun >= pub->layer_count) {
    return AbortPublish(pub, id, Status::InvalidArgument(
        "layer " + std::to_string(pl.getLayer()) + " is one too many: publishBegin announced " +
        std::to_string(pub->layer_count) + " layer(s), and all of them were sent"));
  }
  if (pl.getLayer() != pub->layers_begun) {
    return AbortPublish(pub, id, Status::InvalidArgument("expected layer " + std::to_string(pub->layers_begun) +
                                                  ", got " + std::to_string(pl.getLayer())));
  }
  if (pl.getHeader().size() > limits_.max_header_bytes) {
    return AbortPublish(pub, id, Status::InvalidArgument("layer header over " + std::to_string(limits_.max_header_bytes) +
                                                  " bytes"));
  }
  if (pl.getChunkCount() > limits_.max_chunks_per_layer) {
    return AbortPublish(pub, id, Status::InvalidArgument("too many chunks in a layer"));
  }
  if (Status r = ReserveUncommitted(*pub, pl.getHeader().size()); !r.ok()) return AbortPublish(pub, id, r);
  pub->chunks_expected = pl.getChunkCount();
  pub->chunks_seen = 0;
  const std::uint32_t layer = pub->layers_begun++;
  auto header = AsBytes(pl.getHeader());
  const std::uint32_t chunks = pl.getChunkCount();
  auto keep = std::make_shared<Frame>(std::move(*in.owned));
  RunPublishOp(pub, header.size(), [this, pub, id, layer, header, chunks, keep] {
    if (!pub->failed.ok() || !pub->sink) {
      ReleaseUncommitted(*pub);  // this message's bytes were counted on arrival
      SendError(id, pub->failed.ok() ? Status::Aborted("publish not open") : pub->failed);
      return;
    }
    Status s = pub->sink->BeginLayer(layer, header, chunks);
    if (!s.ok()) return FailPublish(pub, id, s);
    sink_->Send(BuildResponse(id, [](wire::Response::Builder r) { r.setAck(); }));
  });
  return true;
}

bool Session::OnPublishChunk(const Incoming& in, const std::shared_ptr<Publish>& pub) {
  const std::uint64_t id = in.id;
  auto pc = in.req.getPublishChunk();
  if (pub->layers_begun == 0 || pc.getLayer() != pub->layers_begun - 1 ||
      pc.getIndex() != pub->chunks_seen || pub->chunks_seen >= pub->chunks_expected) {
    return AbortPublish(pub, id, Status::InvalidArgument(ChunkOrderError(*pub, pc.getLayer(), pc.getIndex())));
  }
  auto data = pc.getData();
  std::span<const std::byte> bytes;
  std::shared_ptr<ShmRegion> region;
  if (data.which() == wire::Payload::INLINE) {
    bytes = AsBytes(data.getInline());
  } else if (data.which() == wire::Payload::SHM) {
    auto ref = data.getShm();
    if (!shm_) return AbortPublish(pub, id, Status::FailedPrecondition("no shared region attached"));
    if (!shm_->Contains(ref.getOffset(), ref.getLength())) {
      return AbortPublish(pub, id, Status::InvalidArgument("shared-memory reference outside the region"));
    }
    region = shm_;
    bytes = {shm_->data() + ref.getOffset(), static_cast<std::size_t>(ref.getLength())};
  } else {
    return AbortPublish(pub, id, Status::InvalidArgument("unknown payload kind"));
  }
  if (bytes.size() > limits_.max_chunk_bytes) {
    return AbortPublish(pub, id, Status::InvalidArgument("chunk of " + std::to_string(bytes.size()) +
                                                  " bytes over the limit of " +
                                                  std::to_string(limits_.max_chunk_bytes)));
  }
  if (Status r = ReserveUncommitted(*pub, bytes.size()); !r.ok()) return AbortPublish(pub, id, r);
  ++pub->chunks_seen;
  pub->chunk_bytes += bytes.size();
  auto keep = std::make_shared<Frame>(std::move(*in.owned));
  RunPublishOp(pub, bytes.size(), [this, pub, id, bytes, keep, region] {
    if (!pub->failed.ok() || !pub->sink) {
      ReleaseUncommitted(*pub);  // this message's bytes were counted on arrival
      SendError(id, pub->failed.ok() ? Status::Aborted("publish not open") : pub->failed);
      return;
    }
    Status s = pub->sink->AddChunk(bytes);
    if (!s.ok()) return FailPublish(pub, id, s);
    // The ack also tells a shared-memory client its bytes may be reused.
    sink_->Send(BuildResponse(id, [](wire::Response::Builder r) { r.setAck(); }));
  });
  return true;
}

// Commit or abort: the publish leaves the table now.
bool Session::OnPublishEnd(const Incoming& in, const std::shared_ptr<Publish>& pub) {
  const std::uint64_t id = in.id;
  EndPublish(pub);
  if (in.req.which() == wire::Request::PUBLISH_ABORT) {
    RunPublishOp(pub, 0, [this, pub, id] {
      FinishPublish(pub);
      sink_->Send(BuildResponse(id, [](wire::Response::Builder r) { r.setAck(); }));
    });
    return true;
  }
  if (pub->layers_begun != pub->layer_count || pub->chunks_seen != pub->chunks_expected) {
    Status early = Status::InvalidArgument("commit before every layer and chunk arrived: " +
                                           std::to_string(pub->layers_begun) + " of " +
                                           std::to_string(pub->layer_count) + " layers");
    RunPublishOp(pub, 0, [this, pub, id, early = std::move(early)] {
      FinishPublish(pub);
      SendError(id, early);
    });
    return true;
  }
  RunPublishOp(pub, 0, [this, pub, id] {
    if (!pub->failed.ok() || !pub->sink) {
      SendError(id, pub->failed.ok() ? Status::Aborted("publish not open") : pub->failed);
      FinishPublish(pub);
      return;
    }
    auto done = pub->sink->Commit();
    if (!done.ok()) {
      counters_->publish_errors.fetch_add(1, std::memory_order_relaxed);
      SendError(id, done.status());
    } else {
      // Counted before the answer: a client that saw it finds it counted.
      counters_->publish_bytes.fetch_add(pub->chunk_bytes, std::memory_order_relaxed);
      counters_->publish_seconds.Observe(std::chrono::steady_clock::now() - pub->begun);
      sink_->Send(BuildResponse(id, [&](wire::Response::Builder r) { WritePublishResult(*done, r.initPublished()); }));
    }
    FinishPublish(pub);
  });
  return true;
}

bool Session::OnLookup(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  auto q = req.getLookup().getQuery();
  if (!AcceptNamespace(id, q.getNamespace())) return true;
  auto tokens = q.getTokens();
  if (tokens.size() > limits_.max_tokens) {
    SendError(id, Status::InvalidArgument("query over " + std::to_string(limits_.max_tokens) + " tokens"));
    return true;
  }
  Hash128 digest{q.getFingerprint().getDigestLo(), q.getFingerprint().getDigestHi()};
  std::vector<std::uint32_t> toks = ToVector(tokens);
  const bool want_shared = req.getLookup().getWantShared();
  Serve(executor_, [this, id, digest, want_shared, toks = std::move(toks)] {
    std::uint64_t shared = 0;
    auto hit = store_->Lookup(digest, ns_, toks, want_shared ? &shared : nullptr);
    if (!hit.ok()) {
      counters_->lookup_errors.fetch_add(1, std::memory_order_relaxed);
      return SendError(id, hit.status());
    }
    if (*hit) counters_->hit_tokens.fetch_add((*hit)->length, std::memory_order_relaxed);
    sink_->Send(
        BuildResponse(id, [&](wire::Response::Builder r) { WriteLookupHit(*hit, shared, r.initLookup()); }));
  });
  return true;
}

bool Session::OnFetch(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  auto f = req.getFetch();
  auto layers_r = f.getLayers();
  if (layers_r.size() > limits_.max_layers) {
    SendError(id, Status::InvalidArgument("fetch names over " + std::to_string(limits_.max_layers) + " layers"));
    return true;
  }
  auto st = std::make_shared<FetchState>();
  st->id = id;
  if (!OpenWindows(id, f, *st)) return true;
  {
    MutexLock l(&mu_);
    if (fetches_.count(id) != 0) {
      sink_->Send(ErrorResponse(id, ErrorCode::ALREADY_EXISTS, "a fetch with this id is running"));
      return true;
    }
    if (fetches_.size() >= limits_.max_fetches_in_flight) {
      SendError(id, Status::ResourceExhausted("too many fetches in flight on this connection"));
      return true;
    }
    for (auto& [oid, other] : fetches_) {
      const bool same_device = st->device != nullptr && st->device == other->device;
      if ((st->shm && other->shm && st->shm_ring.Overlaps(other->shm_ring)) ||
          (same_device && st->device_ring.Overlaps(other->device_ring))) {
        SendError(id, Status::InvalidArgument("fetch window overlaps the window of fetch " + std::to_string(oid)));
        return true;
      }
    }
    fetches_[id] = st;
  }
  std::vector<std::uint32_t> layers = ToVector(layers_r);
  const std::uint64_t entry = f.getEntry();
  const auto arrived = std::chrono::steady_clock::now();
  Serve(fetch_executor_, [this, id, st, entry, arrived, layers = std::move(layers)] {
    FetchSender sender(id, st.get(), sink_.get(), device_dma_);
    FetchOptions options;
    options.ns = TenantScope();
    Status s = sender.Finish(store_->Fetch(entry, layers, options, sender));
    spdlog::debug("primecached: fetch of entry {}: {}", entry, sender.Timings());
    {
      MutexLock l(&mu_);
      fetches_.erase(id);
    }
    counters_->fetch_bytes.fetch_add(sender.bytes(), std::memory_order_relaxed);
    if (!s.ok()) {
      counters_->fetch_errors.fetch_add(1, std::memory_order_relaxed);
      return SendError(id, s);
    }
    counters_->fetch_seconds.Observe(std::chrono::steady_clock::now() - arrived);
    sink_->Send(BuildResponse(id, [&](wire::Response::Builder r) {
      auto d = r.initFetchDone();
      d.setLayers(sender.layers());
      d.setBytes(sender.bytes());
    }));
  });
  return true;
}

bool Session::OnCancel(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  const std::uint64_t target = req.getCancel().getTarget();
  std::shared_ptr<FetchState> st;
  {
    MutexLock l(&mu_);
    auto it = fetches_.find(target);
    if (it != fetches_.end()) st = it->second;
  }
  if (!st) {
    SendError(id, Status::NotFound("no fetch " + std::to_string(target) + " is running on this connection"));
    return true;
  }
  st->Cancel();
  sink_->Send(BuildResponse(id, [](wire::Response::Builder r) { r.setAck(); }));
  return true;
}

// delete, setByteBudget and compact: admin requests answered with an ack.
bool Session::OnAdminOp(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  const auto which = in.req.which();
  if (!peer_.admin) {
    sink_->Send(ErrorResponse(id, ErrorCode::PERMISSION_DENIED,
                              "delete, setByteBudget and compact are served on the admin socket only"));
    return true;
  }
  std::function<Status()> op;
  if (which == wire::Request::DELETE) {
    op = [this, entry = req.getDelete().getEntry()] { return store_->Delete(entry); };
  } else if (which == wire::Request::SET_BYTE_BUDGET) {
    op = [this, bytes = req.getSetByteBudget().getBytes()] { return store_->SetByteBudget(bytes); };
  } else {
    op = [this] { return store_->Compact(); };
  }
  Serve(executor_, [this, id, op = std::move(op)] {
    Status s = op();
    if (!s.ok()) return SendError(id, s);
    sink_->Send(BuildResponse(id, [](wire::Response::Builder r) { r.setAck(); }));
  });
  return true;
}

bool Session::OnList(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  auto lr = req.getList();
  ListFilter filter;
  if (lr.getDigestLo() != 0 || lr.getDigestHi() != 0) filter.digest = Hash128{lr.getDigestLo(), lr.getDigestHi()};
  if (lr.getAllNamespaces()) {
    if (!peer_.admin) {
      sink_->Send(ErrorResponse(id, ErrorCode::PERMISSION_DENIED, "listing every namespace needs the admin socket"));
      return true;
    }
  } else {
    filter.ns = ns_;
  }
  if (lr.getQuarantined() && !peer_.admin) {
    sink_->Send(ErrorResponse(id, ErrorCode::PERMISSION_DENIED, "listing quarantined entries needs the admin socket"));
    return true;
  }
  filter.quarantined = lr.getQuarantined();
  filter.omit_tokens = lr.getOmitTokens();
  if (lr.getPageToken().size() > 4096) {
    SendError(id, Status::InvalidArgument("page token over 4096 bytes"));
    return true;
  }
  filter.page_token.assign(reinterpret_cast<const char*>(lr.getPageToken().begin()), lr.getPageToken().size());
  filter.page_size = lr.getPageSize() == 0 ? 100 : std::min(lr.getPageSize(), limits_.max_page_size);
  Serve(executor_, [this, id, filter] {
    auto page = store_->List(filter);
    if (!page.ok()) return SendError(id, page.status());
    sink_->Send(BuildResponse(id, [&](wire::Response::Builder r) { WriteListPage(*page, r.initList()); },
                              WordsFor(*page)));
  });
  return true;
}

bool Session::OnStat(const Incoming& in) {
  const std::uint64_t id = in.id;
  if (peer_.allowed_namespaces.has_value()) {
    // The totals are the whole store's, every tenant's together.
    sink_->Send(ErrorResponse(id, ErrorCode::PERMISSION_DENIED,
                              "stat reports the whole store, every namespace together; uid " +
                                  std::to_string(peer_.uid) +
                                  " is limited to its tenant namespaces (the admin socket serves it)"));
    return true;
  }
  Serve(executor_, [this, id] {
    auto st = store_->Stat();
    if (!st.ok()) return SendError(id, st.status());
    DaemonStats d;
    d.store = std::move(st).value();
    d.connections = counters_->connections.load();
    d.publishes_in_flight = counters_->publishes_in_flight.load();
    d.uncommitted_bytes = counters_->uncommitted_bytes.load();
    d.fetch_window_waits = counters_->fetch_window_waits.load();
    d.remote = store_->RemoteCounters();
    sink_->Send(BuildResponse(id, [&](wire::Response::Builder r) { WriteDaemonStats(d, r.initStat()); }));
  });
  return true;
}

bool Session::OnDescribe(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  const std::uint64_t entry = req.getDescribe().getEntry();
  const bool headers = req.getDescribe().getLayerHeaders();
  Serve(executor_, [this, id, entry, headers] {
    // Other tenants' entries, and quarantined ones off the admin socket,
    // are reported as absent.
    auto d = store_->Describe(entry, TenantScope(), headers);
    if (!d.ok()) return SendError(id, d.status());
    sink_->Send(BuildResponse(id, [&](wire::Response::Builder r) { WriteEntryDetail(*d, r.initDescribe()); },
                              WordsFor(*d)));
  });
  return true;
}

bool Session::OnCheckStore(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  if (!peer_.admin) {
    sink_->Send(ErrorResponse(id, ErrorCode::PERMISSION_DENIED, "checkStore is served on the admin socket only"));
    return true;
  }
  const bool read_chunks = req.getCheckStore().getReadChunks();
  Serve(executor_, [this, id, read_chunks] {
    auto report = store_->CheckStore(read_chunks);
    if (!report.ok()) return SendError(id, report.status());
    sink_->Send(BuildResponse(id, [&](wire::Response::Builder r) { WriteStoreCheckReport(*report, r.initStoreCheckReport()); },
                              WordsFor(*report)));
  });
  return true;
}

bool Session::OnCheckEntry(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  const std::uint64_t entry = req.getCheckEntry().getEntry();
  Serve(fetch_executor_, [this, id, entry] {
    CountingSink v;
    FetchOptions options;
    options.ns = TenantScope();
    Status s = store_->Fetch(entry, {}, options, v);
    if (!s.ok() && !s.IsCorruption()) return SendError(id, s);
    sink_->Send(BuildResponse(id, [&](wire::Response::Builder r) {
      auto out = r.initCheckEntry();
      out.setOk(s.ok());
      out.setMessage(s.ok() ? "" : s.ToString());
      out.setLayers(v.layers);
      out.setBytes(v.bytes);
    }));
  });
  return true;
}

bool Session::OnShmAttach(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  const std::uint64_t size = req.getShmAttach().getSize();
  if (in.fds->empty()) {
    SendError(id, Status::InvalidArgument("shmAttach arrived without a descriptor (send it with SCM_RIGHTS)"));
    return true;
  }
  int fd = in.fds->front();
  in.fds->erase(in.fds->begin());
  if (!peer_.local) {
    close(fd);
    SendError(id, Status::NotSupported("shared memory needs a Unix socket"));
    return true;
  }
  if (shm_) {
    close(fd);
    sink_->Send(ErrorResponse(id, ErrorCode::ALREADY_EXISTS, "a shared region is already attached"));
    return true;
  }
  if (size > limits_.max_shm_bytes) {
    close(fd);
    SendError(id, Status::InvalidArgument("shared region over " + std::to_string(limits_.max_shm_bytes) + " bytes"));
    return true;
  }
  auto region = ShmRegion::Adopt(fd, static_cast<std::size_t>(size));
  if (!region.ok()) return SendError(id, region.status()), true;
  shm_ = std::shared_ptr<ShmRegion>(std::move(region).value());
  counters_->shm_regions.fetch_add(1, std::memory_order_relaxed);
  counters_->shm_bytes.fetch_add(shm_->size(), std::memory_order_relaxed);
  sink_->Send(BuildResponse(id, [](wire::Response::Builder r) { r.setAck(); }));
  return true;
}

}  // namespace primecache::ipc
