// PrefixCache's lookup and restore: the staging, the longest stored prefix
// fetched into it (StagedFetch) and restored into a fresh session, then the
// rest of the prompt primed (prefix_cache_publish.cc's PrimeRest).
#include "serving/prefix_cache.h"
#include "serving/staged_fetch.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <variant>

namespace primecache::model {

namespace {

using Clock = std::chrono::steady_clock;

// The staged fetch's callbacks, forwarded to `staged` (filled in by on_hit;
// none comes before it): its layers, chunks and, when StagedFetch takes
// them, device extents.
void ForwardTo(const client::FetchCallbacks& staged, bool device_extents, client::FetchCallbacks* cb) {
  cb->on_layer = [&staged](std::uint32_t l, std::span<const std::byte> h, std::uint32_t n) {
    return staged.on_layer(l, h, n);
  };
  cb->on_chunk_held = [&staged](std::uint32_t l, std::uint32_t i, std::span<const std::byte> b,
                                client::ChunkRelease r) { return staged.on_chunk_held(l, i, b, std::move(r)); };
  if (device_extents) {
    cb->on_device_extent = [&staged](const client::DeviceExtent& x, client::ChunkRelease r) {
      return staged.on_device_extent(x, std::move(r));
    };
  }
}

}  // namespace

Status PrefixCache::GrowStaging(std::uint64_t bytes) {
  engine::Device& dev = model_->engine().device();
  if (staging_.bytes() < bytes) {
    staging_.Reset();
    PC_ASSIGN_OR_RETURN(staging_, dev.AllocatePinned(bytes));
  }
  if (device_staging_ && device_staging_mem_.bytes() < bytes) {
    device_staging_mem_.Reset();
    PC_ASSIGN_OR_RETURN(device_staging_mem_, dev.Allocate(bytes));
  }
  return Status::Ok();
}

Status PrefixCache::ReserveStaging(std::uint64_t tokens) {
  PC_ASSIGN_OR_RETURN(auto session, model_->NewSession());
  const std::uint64_t bound = StagingFloats(session.cache->plan(), tokens) * sizeof(float);
  PC_RETURN_IF_ERROR(GrowStaging(bound));
  if (client_ == nullptr || !options_.publish) return Status::Ok();
  PC_ASSIGN_OR_RETURN(engine::Memory arena, TakeArena(bound));
  std::lock_guard lock(mu_);
  arenas_.push_back(std::move(arena));
  return Status::Ok();
}

Result<std::uint64_t> PrefixCache::TryRestore(ModelSession& session, std::span<const std::uint32_t> tokens,
                                              Request* figures) {
  if (options_.tp.size > 1) return TryRestoreRank(session, tokens, figures);
  if (client_ == nullptr || tokens.size() < options_.min_prefix) return std::uint64_t{0};
  engine::SessionCache& cache = *session.cache;
  engine::Device& dev = model_->engine().device();
  RegisterRegion();
  // The lookup and the fetch of its hit are one call (one round trip); the
  // staging is grown to the hit's bound and the fetch's sink made once the
  // hit is known, before its first layer arrives.
  const auto t_lookup = Clock::now();
  Clock::time_point t_fetch;
  std::optional<StagedFetch> fetch;
  client::FetchCallbacks staged;  // fetch's, once made
  std::optional<LookupHit> hit;
  Status staging_failed;
  client::FetchCallbacks cb;
  cb.on_hit = [&](const LookupHit& h) -> Status {
    t_fetch = Clock::now();
    hit = h;
    if (h.length < options_.min_prefix) return Status::Aborted("a hit shorter than the prefix cache's minimum");
    // An entry of a TP engine streams nothing here (skip_parted_hits): its
    // layers are head-group parts, gathered below.
    if (h.ranks > 1) return Status::Ok();
    const std::uint64_t bound = StagingFloats(cache.plan(), h.length) * sizeof(float);
    staging_failed = GrowStaging(bound);
    if (!staging_failed.ok()) return staging_failed;
    fetch.emplace(dev, *decode_pool_, cache.Geometry(), staging_.at<float>(0),
                  device_staging_ ? device_staging_mem_.at<float>(0) : nullptr, bound / sizeof(float),
                  std::span(device_window_.at<const std::byte>(0), device_window_.bytes()));
    staged = fetch->Callbacks();
    return Status::Ok();
  };
  cb.skip_parted_hits = true;
  ForwardTo(staged, device_staging_ && !device_window_.empty(), &cb);
  const bool want_shared = options_.publish && options_.publish_branch_points;
  auto found = client_->LookupAndFetch(model_id_, tokens, cb, want_shared ? &figures->shared_tokens : nullptr);
  const auto t_end = Clock::now();
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  figures->lookup_ms = ms((hit ? t_fetch : t_end) - t_lookup);
  Status fetched = fetch ? fetch->Finish(found.status()) : found.status();
  figures->fetch_ms = hit ? ms(Clock::now() - t_fetch) : 0;
  if (!staging_failed.ok()) return staging_failed;
  if (hit && hit->ranks > 1 && hit->length >= options_.min_prefix)
    return RestoreParts(session, *hit, figures);
  if (!fetch) {
    // A miss, a hit too short to restore, or a lookup that failed: primed in full.
    if (!hit && !found.ok()) NoteFailure("lookup", found.status());
    return std::uint64_t{0};
  }
  figures->direct_chunks = fetch->direct_chunks();
  figures->device_chunks = fetch->device_chunks();
  figures->device_chunk_bytes = fetch->device_chunk_bytes();
  if (!fetched.ok()) {
    NoteFailure("restoring entry " + std::to_string(hit->id), fetched);
    return std::uint64_t{0};
  }
  const std::uint64_t len = hit->length;
  const auto t_copy = Clock::now();
  const std::vector<engine::LayerSnapshotView> views = fetch->Views();
  // Restore validates every layer (the one whole-set validation) before the
  // first byte reaches the cache: a refusal leaves the session fresh. A cache
  // that is no longer fresh failed while copying.
  Status restored =
      cache.Restore(views, device_staging_ ? engine::PlaneResidence::kDevice : engine::PlaneResidence::kHost);
  if (!restored.ok() && cache.fresh()) {
    spdlog::warn("prefix cache: entry {} refused: {}", hit->id, restored.ToString());
    return std::uint64_t{0};
  }
  PC_RETURN_IF_ERROR(restored);
  PC_RETURN_IF_ERROR(dev.Synchronize(engine::Lane::kCompute));
  session.position = len;
  figures->copy_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_copy).count();
  figures->restored_bytes = fetch->floats() * sizeof(float);
  return len;
}

Result<Request> PrefixCache::Prime(std::span<const std::uint32_t> prompt, bool all_logits) {
  if (prompt.empty()) return Status::InvalidArgument("prefix cache: empty prompt");
  const auto t0 = Clock::now();
  Request r;
  r.prompt.assign(prompt.begin(), prompt.end());
  PC_ASSIGN_OR_RETURN(r.session, model_->NewSession());
  // At least the last prompt token is primed: its logits pick the first new token.
  auto restored = TryRestore(r.session, prompt.first(prompt.size() - 1), &r);
  r.restore_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!restored.ok()) {
    // A device failure mid-restore leaves the cache unusable: start afresh.
    spdlog::warn("prefix cache: restore failed ({}); prefilling in full", restored.status().ToString());
    r.session = ModelSession{};
    PC_ASSIGN_OR_RETURN(r.session, model_->NewSession());
  }
  r.restored_tokens = restored.ok() ? *restored : 0;
  std::vector<float> logits;
  PC_RETURN_IF_ERROR(PrimeRest(r, all_logits, &logits));
  const std::size_t V = model_->config().vocab;
  r.last_logits.assign(logits.end() - static_cast<std::ptrdiff_t>(V), logits.end());
  if (all_logits) r.all_logits = std::move(logits);
  r.prefilled_tokens = prompt.size() - r.restored_tokens;
  r.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (client_ != nullptr && options_.publish && options_.publish_prompt_end) {
    auto cap = r.session.cache->CaptureEager();
    if (cap.ok()) {
      r.capture.emplace(std::move(cap).value());
    } else {
      spdlog::warn("prefix cache: no eager capture of this boundary: {}", cap.status().ToString());
    }
  }
  return r;
}

}  // namespace primecache::model
