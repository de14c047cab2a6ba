// The publish family: publishBegin, publishLayer, publishChunk,
// publishCommit and publishAbort, and each publish's serial queue of store
// steps on the workers.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "ipc/session.h"
#include "ipc/session_internal.h"
#include "ipc/wire.h"

namespace primecache::ipc {

using session_internal::AsBytes;
using session_internal::NowNs;
using session_internal::ReadText;

namespace {

// A publish into the store, as the wire streams it: the wire announces the
// next layer where the store's Publisher wants EndLayer between layers; an
// identity already stored (PublishStart::existing) takes the bytes that
// follow and drops them.
class StorePublish {
 public:
  explicit StorePublish(PublishStart start) : p_(std::move(start.publisher)) {
    if (start.existing) existing_.id = *start.existing, existing_.existed = true;
  }
  ~StorePublish() { Abort(); }
  StorePublish(const StorePublish&) = delete;
  StorePublish& operator=(const StorePublish&) = delete;

  Status BeginLayer(std::uint32_t, std::span<const std::byte> header, std::uint32_t chunk_count) {
    if (!p_) return Status::Ok();
    if (in_layer_) PC_RETURN_IF_ERROR(p_->EndLayer());
    in_layer_ = true;
    return p_->BeginLayer(std::string_view(reinterpret_cast<const char*>(header.data()), header.size()),
                          chunk_count);
  }
  // `bytes` may lie in a client's shared region: passed on, never copied here.
  Status AddChunk(std::span<const std::byte> bytes) { return p_ ? p_->AddChunk(bytes) : Status::Ok(); }
  // Durable on OK.
  Result<PublishResult> Commit() {
    if (!p_) return existing_;
    if (in_layer_) {
      in_layer_ = false;
      PC_RETURN_IF_ERROR(p_->EndLayer());
    }
    committed_ = true;
    return p_->Commit();
  }
  // Leaves nothing behind (nothing after a commit).
  void Abort() {
    if (p_ && !committed_) {
      p_->Abort();
      committed_ = true;
    }
  }

 private:
  std::unique_ptr<Publisher> p_;
  PublishResult existing_;
  bool in_layer_ = false;
  bool committed_ = false;
};

}  // namespace

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
  std::unique_ptr<StorePublish> sink;
  Status failed;
  bool finished = false;

  // Bytes counted against the uncommitted bounds (released when finished).
  std::atomic<std::uint64_t> reserved{0};
  // When data last arrived for it or an op of it was applied (steady ns).
  std::atomic<std::int64_t> progress_ns{0};
  std::atomic<std::uint32_t> ops_pending{0};  // queued or running
};

namespace {

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


// OK while the publish's store sink is open; otherwise what a step of it
// answers: the failure that closed it, or that it is not open.
Status WhyNotOpen(const Session::Publish& pub) {
  if (pub.failed.ok() && pub.sink) return Status::Ok();
  return pub.failed.ok() ? Status::Aborted("publish not open") : pub.failed;
}

// A publishBegin's prefill cost, in bounds for its `layer_count` layers.
Result<ModelCost> ReadCost(wire::PublishBegin::Reader pb, std::uint32_t layer_count) {
  ModelCost cost;
  if (!pb.hasCost()) return cost;
  auto c = pb.getCost();
  cost = {c.getFlopsPerToken(), c.getAttentionLayers(), c.getAttentionFlopsPerPair()};
  if (cost.flops_per_token > (1ull << 50) || cost.attention_layers > layer_count ||
      cost.attention_flops_per_pair > (1ull << 40)) {
    return Status::InvalidArgument("prefill cost out of bounds: " + std::to_string(cost.flops_per_token) +
                                   " flops a token (at most 2^50), " + std::to_string(cost.attention_layers) +
                                   " attention layers (at most " + std::to_string(layer_count) + "), " +
                                   std::to_string(cost.attention_flops_per_pair) + " flops a pair (at most 2^40)");
  }
  return cost;
}

}  // namespace

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
    Deliver(0, Status::DeadlineExceeded(ExpiredReason(p->id)));
    QueueFinishPublish(p);
  }
}

std::string Session::ExpiredReason(std::uint64_t publish) const {
  MutexLock l(&mu_);
  for (const auto& [id, why] : expired_) {
    if (id == publish) return why;
  }
  return "";
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

Answer Session::RunPublishStep(const std::shared_ptr<Publish>& pub, std::uint64_t id, std::size_t bytes,
                               std::function<Answer()> step, AfterAnswer after) {
  RunPublishOp(pub, bytes, [this, pub, id, after, step = std::move(step)] {
    Deliver(id, step());
    if (after == AfterAnswer::kFinish) FinishPublish(pub);
  });
  return Answer::Queued();
}

void Session::QueueFinishPublish(const std::shared_ptr<Publish>& pub) {
  RunPublishOp(pub, 0, [this, pub] { FinishPublish(pub); });
}

void Session::ForgetEnded(const Publish& pub) {
  MutexLock l(&mu_);
  auto it = ending_.find(pub.id);
  if (it != ending_.end() && it->second.get() == &pub) ending_.erase(it);
}

Status Session::FailPublish(const std::shared_ptr<Publish>& pub, Status s) {
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
  return pub->failed;
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

Answer Session::OnPublishBegin(const Incoming& in) {
  const std::uint64_t id = in.id;
  auto pb = in.req.getPublishBegin();
  auto b = pb.getBoundary();
  auto fp = b.getFingerprint();
  auto name = ReadText(fp.getName(), limits_.max_text_bytes, "model name");
  if (!name.ok()) return name.status();
  if (auto refused = RefuseNamespace(b.getNamespace())) return std::move(*refused);
  if (fp.getDescriptor().size() > limits_.max_descriptor_bytes) {
    return Status::InvalidArgument("model descriptor over " + std::to_string(limits_.max_descriptor_bytes) + " bytes");
  }
  auto tokens = b.getTokens();
  if (tokens.size() == 0 || tokens.size() > limits_.max_tokens) {
    return Status::InvalidArgument("boundary needs 1.." + std::to_string(limits_.max_tokens) + " tokens");
  }
  if (b.getLength() != tokens.size()) {
    return Status::InvalidArgument("boundary length " + std::to_string(b.getLength()) + " != " +
                                   std::to_string(tokens.size()) + " tokens");
  }
  const std::uint32_t layer_count = pb.getLayerCount();
  if (layer_count == 0 || layer_count > limits_.max_layers) {
    return Status::InvalidArgument("layer count must be 1.." + std::to_string(limits_.max_layers));
  }
  auto cost = ReadCost(pb, layer_count);
  if (!cost.ok()) return cost.status();
  std::optional<PublishGroup> group;
  if (pb.hasGroup()) {
    auto g = pb.getGroup();
    group = PublishGroup{g.getToken(), g.getRanks(), g.getRank()};  // bounded by the store (CheckRequest)
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
  pub->key.cost = *cost;
  pub->key.group = group;
  {
    MutexLock l(&mu_);
    if (publishes_.count(id) != 0) return Status::AlreadyExists("a publish with this id is open");
    if (publishes_open_ >= limits_.max_publishes_in_flight) {
      return Status::ResourceExhausted("too many publishes in flight on this connection (limit " +
                                       std::to_string(limits_.max_publishes_in_flight) + ")");
    }
    ++publishes_open_;
    publishes_[id] = pub;
  }
  counters_->publishes_in_flight.fetch_add(1);
  return RunPublishStep(pub, id, 0, [this, pub, id]() -> Answer {
    auto start = store_->BeginPublish(pub->key);
    if (!start.ok()) return FailPublish(pub, start.status());
    pub->sink = std::make_unique<StorePublish>(std::move(start).value());
    return Answer::Ack(id);
  });
}

Answer Session::OnPublishStep(const Incoming& in) {
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
    return RunPublishStep(ending, id, 0,
                          [pid]() -> Answer { return Status::NotFound("no open publish " + std::to_string(pid)); });
  }
  if (!pub) {
    const std::string expired = ExpiredReason(pid);
    if (!expired.empty()) return Status::DeadlineExceeded(expired);
    return Status::NotFound("no open publish " + std::to_string(pid));
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

Answer Session::AbortPublish(const std::shared_ptr<Publish>& pub, std::uint64_t id, Status s) {
  EndPublish(pub);
  // Answered from the publish's queue, after the steps before it (their
  // answers come from there), once its staged bytes are gone.
  return RunPublishStep(pub, id, 0, [this, pub, s = std::move(s)]() -> Answer {
    FinishPublish(pub);
    return s;
  });
}

Answer Session::OnPublishLayer(const Incoming& in, const std::shared_ptr<Publish>& pub) {
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
    return AbortPublish(pub, id, Status::InvalidArgument("layer header over " +
                                                         std::to_string(limits_.max_header_bytes) + " bytes"));
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
  return RunPublishStep(pub, id, header.size(), [this, pub, id, layer, header, chunks, keep]() -> Answer {
    if (Status closed = WhyNotOpen(*pub); !closed.ok()) {
      ReleaseUncommitted(*pub);  // this message's bytes were counted on arrival
      return closed;
    }
    Status s = pub->sink->BeginLayer(layer, header, chunks);
    if (!s.ok()) return FailPublish(pub, s);
    return Answer::Ack(id);
  });
}

Answer Session::OnPublishChunk(const Incoming& in, const std::shared_ptr<Publish>& pub) {
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
  return RunPublishStep(pub, id, bytes.size(), [this, pub, id, bytes, keep, region]() -> Answer {
    if (Status closed = WhyNotOpen(*pub); !closed.ok()) {
      ReleaseUncommitted(*pub);  // this message's bytes were counted on arrival
      return closed;
    }
    Status s = pub->sink->AddChunk(bytes);
    if (!s.ok()) return FailPublish(pub, s);
    // The ack also tells a shared-memory client its bytes may be reused.
    return Answer::Ack(id);
  });
}

// Commit or abort: the publish leaves the table now.
Answer Session::OnPublishEnd(const Incoming& in, const std::shared_ptr<Publish>& pub) {
  const std::uint64_t id = in.id;
  if (in.req.which() == wire::Request::PUBLISH_ABORT) {
    EndPublish(pub);
    return RunPublishStep(pub, id, 0, [this, pub, id]() -> Answer {
      FinishPublish(pub);
      return Answer::Ack(id);
    });
  }
  if (pub->layers_begun != pub->layer_count || pub->chunks_seen != pub->chunks_expected) {
    Status early = Status::InvalidArgument("commit before every layer and chunk arrived: " +
                                           std::to_string(pub->layers_begun) + " of " +
                                           std::to_string(pub->layer_count) + " layers");
    return AbortPublish(pub, id, std::move(early));
  }
  EndPublish(pub);
  // Answered before the publish is finished.
  return RunPublishStep(
      pub, id, 0,
      [this, pub, id]() -> Answer {
        if (Status closed = WhyNotOpen(*pub); !closed.ok()) return closed;
        auto done = pub->sink->Commit();
        if (!done.ok()) {
          counters_->publish_errors.fetch_add(1, std::memory_order_relaxed);
          return done.status();
        }
        // Counted before the answer: a client that saw it finds it counted.
        counters_->publish_bytes.fetch_add(pub->chunk_bytes, std::memory_order_relaxed);
        if (pub->key.group) counters_->rank_publish_bytes.Add(pub->key.group->rank, pub->chunk_bytes);
        counters_->publish_seconds.Observe(std::chrono::steady_clock::now() - pub->begun);
        return BuildResponse(id, [&](wire::Response::Builder r) { WritePublishResult(*done, r.initPublished()); });
      },
      AfterAnswer::kFinish);
}

}  // namespace primecache::ipc
