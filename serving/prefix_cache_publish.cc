// PrefixCache's capture and publish: the eager halves taken while priming
// (at the branch point and the checkpoints) and at the prompt's end, their
// deferred halves completed into pinned arenas at Finish, and the worker
// that encodes each layer's chunks and publishes them.
#include "serving/prefix_cache.h"

#include "primecache/internal/shard.h"
#include "serving/head_groups.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>
#include <variant>

namespace primecache::model {

namespace {

// Runs fn(0..n-1) on the pool and waits for all of them; the first error.
Status RunOnPool(WorkerPool& pool, std::size_t n, const std::function<Status(std::size_t)>& fn) {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t left = n;
  Status first;
  for (std::size_t i = 0; i < n; ++i) {
    pool.Post([&, i] {
      Status s = fn(i);
      std::lock_guard lock(mu);
      if (!s.ok() && first.ok()) first = s;
      if (--left == 0) cv.notify_all();
    });
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return left == 0; });
  return first;
}

}  // namespace

std::vector<std::uint64_t> PrefixCache::PrefillCuts(const Request& r) const {
  std::vector<std::uint64_t> cuts;
  if (client_ == nullptr || !options_.publish) return cuts;
  const std::uint64_t from = r.restored_tokens, to = r.prompt.size();
  if (options_.publish_branch_points && r.shared_tokens > from && r.shared_tokens < to) cuts.push_back(r.shared_tokens);
  if (const std::uint64_t n = options_.checkpoint_every; n > 0) {
    for (std::uint64_t at = (from / n + 1) * n; at < to; at += n) cuts.push_back(at);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

Status PrefixCache::PrimeRest(Request& r, bool all_logits, std::vector<float>* logits) {
  const std::span<const std::uint32_t> prompt(r.prompt);
  const LogitsWanted want = all_logits ? LogitsWanted::kAll : LogitsWanted::kLast;
  std::uint64_t at = r.restored_tokens;
  // The eager half taken at the previous cut: collected (its trip to host
  // memory done meanwhile, its slot freed) before the next one is taken.
  std::optional<std::pair<std::uint64_t, engine::PendingCapture>> pending;
  auto collect = [&] {
    if (!pending) return;
    auto eager = pending->second.Collect();
    if (eager.ok()) {
      r.prefill_captures.emplace_back(pending->first, std::move(eager).value());
    } else {
      spdlog::warn("prefix cache: boundary at {} tokens lost: {}", pending->first, eager.status().ToString());
    }
    pending.reset();
  };
  for (std::uint64_t cut : PrefillCuts(r)) {
    // Positions before the cut keep their logits only when all are asked for.
    std::vector<float> part;
    PC_RETURN_IF_ERROR(model_->Prime(r.session, prompt.subspan(at, cut - at),
                                     all_logits ? LogitsWanted::kAll : LogitsWanted::kNone,
                                     all_logits ? &part : nullptr));
    logits->insert(logits->end(), part.begin(), part.end());
    at = cut;
    collect();
    auto cap = r.session.cache->CaptureEager();
    if (cap.ok()) {
      pending.emplace(cut, std::move(cap).value());
    } else {
      // A boundary this request would have added; the request goes on.
      spdlog::warn("prefix cache: no capture at {} tokens: {}", cut, cap.status().ToString());
    }
  }
  std::vector<float> rest;
  PC_RETURN_IF_ERROR(model_->Prime(r.session, prompt.subspan(at), want, &rest));
  logits->insert(logits->end(), rest.begin(), rest.end());
  collect();
  return Status::Ok();
}

void PrefixCache::Finish(Request& r, std::span<const std::uint32_t> generated) {
  engine::SessionCache& cache = *r.session.cache;
  for (auto& [length, eager] : r.prefill_captures) {
    QueuePublish(cache, std::move(eager), std::vector<std::uint32_t>(r.prompt.begin(), r.prompt.begin() + length));
  }
  r.prefill_captures.clear();
  if (r.capture) {
    auto eager = r.capture->Collect();
    r.capture.reset();
    if (eager.ok()) {
      QueuePublish(cache, std::move(eager).value(), r.prompt);
    } else {
      spdlog::warn("prefix cache: eager capture lost: {}", eager.status().ToString());
    }
  }
  // The generation's end: off the decode path already, so both halves now.
  const std::uint64_t fed = r.session.position > r.prompt.size() ? r.session.position - r.prompt.size() : 0;
  if (client_ == nullptr || !options_.publish || !options_.publish_generation_end || fed == 0) return;
  if (fed > generated.size()) {
    spdlog::warn("prefix cache: {} tokens fed after the prompt, {} generated given: the generation end is not published",
                 fed, generated.size());
    return;
  }
  std::vector<std::uint32_t> tokens = r.prompt;
  tokens.insert(tokens.end(), generated.begin(), generated.begin() + static_cast<std::ptrdiff_t>(fed));
  auto cap = cache.CaptureEager();
  auto eager = cap.ok() ? cap->Collect() : Result<engine::EagerHalf>(cap.status());
  if (!eager.ok()) {
    spdlog::warn("prefix cache: no capture of the generation's end: {}", eager.status().ToString());
    return;
  }
  QueuePublish(cache, std::move(eager).value(), std::move(tokens));
}

void PrefixCache::QueuePublish(engine::SessionCache& cache, engine::EagerHalf eager, std::vector<std::uint32_t> tokens) {
  // The deferred half downloads into a pinned arena the encoder reads.
  engine::Memory arena;
  const engine::CaptureSpace space = [&](std::uint64_t floats) -> Result<std::span<float>> {
    PC_ASSIGN_OR_RETURN(arena, TakeArena(std::max<std::uint64_t>(floats, 1) * sizeof(float)));
    return std::span<float>(arena.at<float>(0), floats);
  };
  auto layers = cache.CompleteCaptureInto(std::move(eager), space);
  if (!layers.ok()) {
    spdlog::warn("prefix cache: boundary of {} tokens not published: {}", tokens.size(), layers.status().ToString());
    if (!arena.empty()) {
      std::lock_guard lock(mu_);
      arenas_.push_back(std::move(arena));
    }
    return;
  }
  {
    std::lock_guard lock(mu_);
    queue_.push_back(Job{std::move(tokens), std::move(arena), std::move(layers).value()});
  }
  cv_.notify_all();
}

std::size_t PrefixCache::Drain() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  return failed_;
}

Status PrefixCache::Publish(std::span<const std::uint32_t> tokens, const std::vector<LayerSnapshot>& layers) {
  const std::vector<engine::LayerSnapshotView> views = engine::ViewsOf(layers);
  return Publish(tokens, views);
}

Status PrefixCache::Publish(std::span<const std::uint32_t> tokens, std::span<const engine::LayerSnapshotView> layers) {
  if (client_ == nullptr) return Status::Unavailable("prefix cache: no daemon");
  const PrefixCacheOptions::TpRank& tp = options_.tp;
  if (tp.size == 1) {
    std::lock_guard publishing(publish_mu_);  // one publish at a time: the scratch is shared
    return PublishEntry(tokens, layers, std::nullopt).status();
  }
  // A rank of a TP engine publishes its head-group parts of the group
  // (serving/head_groups.h), one after the other, its first part last.
  PC_ASSIGN_OR_RETURN(std::vector<GroupPart> parts, RankGroupParts(layers, model_->config().attn.kv_heads,
                                                                   tp.size, tp.rank, tp.group_token));
  std::lock_guard publishing(publish_mu_);
  for (const GroupPart& part : parts) {
    PC_ASSIGN_OR_RETURN(PublishResult r, PublishEntry(tokens, part.layers, part.group));
    if (r.existed) break;  // stored meanwhile: nothing more to send
  }
  return Status::Ok();
}

Result<PublishResult> PrefixCache::PublishEntry(std::span<const std::uint32_t> tokens,
                                                std::span<const engine::LayerSnapshotView> layers,
                                                const std::optional<PublishGroup>& group) {
  PC_ASSIGN_OR_RETURN(auto stream,
                      client_->BeginPublish(model_id_, tokens, static_cast<std::uint32_t>(layers.size()), group));
  for (const engine::LayerSnapshotView& view : layers) PC_RETURN_IF_ERROR(PublishLayer(*stream, view));
  return stream->Commit();
}

// Every chunk is written once, by the encoder (chunks in parallel on the
// encode pool), reading the planes where they lie. The header (which records
// every chunk) goes first, so a layer's chunks are all encoded before any is
// sent: into space reserved in the client's shared region when the layer
// fits in part of its publish half (nothing is copied again), else into the
// scratch, from which AddChunk copies them into the region.
Status PrefixCache::PublishLayer(client::PublishStream& stream, const engine::LayerSnapshotView& view) {
  PC_ASSIGN_OR_RETURN(LayerEncoder enc, LayerEncoder::Create(engine::ShapeOfView(view),
                                                             engine::PlanesOfView(view), options_.encode));
  const std::size_t n = enc.chunk_count();
  // The client hands out region space in 4 KiB extents (ReservedChunk).
  constexpr std::uint64_t kExtent = 4096;
  std::uint64_t room = 0, extents = 0;
  for (std::size_t i = 0; i < n; ++i) {
    room += enc.MaxChunkBytes(i);
    extents += (enc.MaxChunkBytes(i) + kExtent - 1) / kExtent * kExtent;
  }
  const client::SharedRegion region = client_->region();
  // A layer's reservations are all held at once: three quarters of the publish
  // half at most, so one layer never waits on space only its own chunks hold.
  const bool in_place = region.base != nullptr && extents <= region.size / 2 / 4 * 3;
  std::vector<client::ReservedChunk> reserved;
  std::vector<std::span<std::byte>> space(n);
  if (!in_place && chunk_scratch_.size() < room) chunk_scratch_.resize(room);
  for (std::size_t i = 0, at = 0; i < n; at += enc.MaxChunkBytes(i), ++i) {
    if (in_place) {
      PC_ASSIGN_OR_RETURN(client::ReservedChunk rc, stream.ReserveChunk(enc.MaxChunkBytes(i)));
      space[i] = rc.bytes();
      reserved.push_back(std::move(rc));
    } else {
      space[i] = std::span(chunk_scratch_).subspan(at, enc.MaxChunkBytes(i));
    }
  }
  std::vector<std::size_t> sizes(n);
  PC_RETURN_IF_ERROR(RunOnPool(*encode_pool_, n, [&](std::size_t i) -> Status {
    PC_ASSIGN_OR_RETURN(sizes[i], enc.EncodeChunk(i, space[i]));
    return Status::Ok();
  }));
  PC_ASSIGN_OR_RETURN(LayerHeader header, enc.Finish());
  const std::string h = SerializeLayerHeader(header);
  PC_RETURN_IF_ERROR(stream.BeginLayer(AsBytes(h), static_cast<std::uint32_t>(n)));
  for (std::size_t i = 0; i < n; ++i) {
    PC_RETURN_IF_ERROR(in_place ? stream.AddReservedChunk(std::move(reserved[i]), sizes[i])
                                : stream.AddChunk(space[i].first(sizes[i])));
    published_bytes_ += sizes[i];
  }
  if (in_place) in_place_layers_ += 1;
  return Status::Ok();
}

void PrefixCache::PublishLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    Status s = Publish(job.tokens, job.layers);
    {
      std::lock_guard lock(mu_);
      busy_ = false;
      arenas_.push_back(std::move(job.arena));
      if (s.ok()) {
        ++published_;
      } else {
        ++failed_;
      }
    }
    if (!s.ok()) NoteFailure("the publish of a " + std::to_string(job.tokens.size()) + "-token boundary", s);
    cv_.notify_all();
  }
}

}  // namespace primecache::model
