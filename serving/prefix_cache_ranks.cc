// PrefixCache as one rank of a tensor-parallel engine (PrefixCacheOptions::tp):
// the hit agreed from rank 0's lookup, each rank's own parts fetched (into
// its staging when the entry is of this TP size, resharded on the host
// otherwise), and the restore made only when every rank validated its parts.
//
// Every rank makes the same collective calls in the same order whatever its
// own lookup, fetch or validation did (a call skipped on one rank would
// leave the others waiting): BroadcastWords once, then AllRanksOk once
// when there was a hit.
#include <spdlog/spdlog.h>

#include <array>
#include <chrono>

#include "engine/model/collective.h"
#include "primecache/internal/rank_parts.h"
#include "serving/prefix_cache.h"
#include "serving/staged_fetch.h"
#include "serving/tp_prefix_cache.h"

namespace primecache::model {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The fetch's callbacks with entry layer e announced as local layer local[e]
// (StagedFetch's geometry is the rank's own layers); any other layer is refused.
client::FetchCallbacks Remapped(const client::FetchCallbacks& staged, std::vector<std::int64_t> local) {
  auto to = [local = std::move(local)](std::uint32_t e) -> Result<std::uint32_t> {
    if (e >= local.size() || local[e] < 0) {
      return Status::Corruption("entry layer " + std::to_string(e) + " was not asked for");
    }
    return static_cast<std::uint32_t>(local[e]);
  };
  client::FetchCallbacks cb;
  cb.on_layer = [staged, to](std::uint32_t e, std::span<const std::byte> h, std::uint32_t n) -> Status {
    PC_ASSIGN_OR_RETURN(std::uint32_t l, to(e));
    return staged.on_layer(l, h, n);
  };
  cb.on_chunk_held = [staged, to](std::uint32_t e, std::uint32_t i, std::span<const std::byte> b,
                                  client::ChunkRelease r) -> Status {
    PC_ASSIGN_OR_RETURN(std::uint32_t l, to(e));
    return staged.on_chunk_held(l, i, b, std::move(r));
  };
  if (staged.on_device_extent) {
    cb.on_device_extent = [staged, to](const client::DeviceExtent& x, client::ChunkRelease r) -> Status {
      PC_ASSIGN_OR_RETURN(std::uint32_t l, to(x.layer));
      client::DeviceExtent mine = x;
      mine.layer = l;
      return staged.on_device_extent(mine, std::move(r));
    };
  }
  return cb;
}

}  // namespace

Result<std::pair<LookupHit, std::uint64_t>> PrefixCache::AgreeOnHit(std::span<const std::uint32_t> tokens) {
  Collective* group = model_->collective();
  // id (0: none), length, ranks, layers, chunk bytes, the branch point.
  std::array<std::uint64_t, 6> words{};
  if ((group == nullptr || options_.tp.rank == 0) && client_ != nullptr &&
      tokens.size() >= options_.min_prefix) {
    RegisterRegion();
    std::uint64_t shared = 0;
    const bool want_shared = options_.publish && options_.publish_branch_points;
    auto hit = client_->Lookup(model_id_, tokens, want_shared ? &shared : nullptr);
    if (!hit.ok()) {
      NoteFailure("lookup", hit.status());
    } else if (*hit && (*hit)->length >= options_.min_prefix) {
      words = {(*hit)->id, (*hit)->length, (*hit)->ranks, (*hit)->layers, (*hit)->chunk_bytes, shared};
    } else {
      words[5] = shared;
    }
  }
  if (group != nullptr) PC_RETURN_IF_ERROR(BroadcastWords(*group, model_->engine().device(), words));
  LookupHit hit;
  hit.id = words[0];
  hit.length = words[1];
  if (words[2] > UINT32_MAX || words[3] > UINT32_MAX)
    return Status::Internal("TP restore: a hit out of range");
  hit.ranks = static_cast<std::uint32_t>(words[2]);
  hit.layers = static_cast<std::uint32_t>(words[3]);
  hit.chunk_bytes = words[4];
  return std::pair{hit, words[5]};
}

Status PrefixCache::FetchOwnParts(const LookupHit& hit, engine::SessionCache& cache,
                                  std::optional<StagedFetch>* fetch, Request* figures) {
  if (hit.ranks == 0 || hit.ranks % options_.tp.size != 0)
    return Status::Internal("TP restore: parts of another size");
  const std::uint32_t n = hit.ranks / options_.tp.size;  // parts of each sharded layer this rank reads
  PC_ASSIGN_OR_RETURN(RankPartsPlan plan, PlanRankParts(ShardedLayers(cache.plan()), hit.layers, hit.ranks,
                                                        options_.tp.size, options_.tp.rank));
  // Each fetched entry layer is announced as its place in the fetch, with
  // the geometry of its model layer (of one part of it, when sharded).
  std::vector<std::int64_t> local(hit.layers, -1);
  for (std::size_t i = 0; i < plan.fetch.size(); ++i) local[plan.fetch[i]] = static_cast<std::int64_t>(i);
  const std::vector<LayerGeometry> mine = cache.Geometry();
  std::vector<LayerGeometry> geometry(plan.fetch.size());
  std::vector<std::vector<std::uint32_t>> parts(plan.layers.size());
  for (std::size_t m = 0; m < plan.layers.size(); ++m) {
    for (std::uint32_t e : plan.layers[m].entry_layers) {
      const auto i = static_cast<std::uint32_t>(local[e]);
      if (plan.layers[m].sharded && n > 1) {
        PC_ASSIGN_OR_RETURN(geometry[i], PartGeometry(mine[m], n));
      } else {
        geometry[i] = mine[m];
      }
      parts[m].push_back(i);
    }
  }
  // The staging's bound: the rank's own layers at the hit's length, and
  // room for its sharded layers gathered from their parts.
  const std::uint64_t floats =
      StagingFloats(cache.plan(), hit.length) + (n > 1 ? StagingFloats(cache.plan(), hit.length, true) : 0);
  PC_RETURN_IF_ERROR(GrowStaging(floats * sizeof(float)));
  engine::Device& dev = model_->engine().device();
  fetch->emplace(dev, *decode_pool_, std::move(geometry), staging_.at<float>(0),
                 device_staging_ ? device_staging_mem_.at<float>(0) : nullptr, floats,
                 std::span(device_window_.at<const std::byte>(0), device_window_.bytes()));
  client::FetchCallbacks staged = (*fetch)->Callbacks();
  if (!device_staging_ || device_window_.empty()) staged.on_device_extent = nullptr;
  const auto t_fetch = Clock::now();
  Status fetched = (*fetch)->Finish(client_->Fetch(hit.id, plan.fetch, Remapped(staged, std::move(local))));
  if (fetched.ok()) fetched = (*fetch)->GatherParts(parts);
  figures->fetch_ms = MsSince(t_fetch);
  PC_RETURN_IF_ERROR(fetched);
  figures->direct_chunks = (*fetch)->direct_chunks();
  figures->device_chunks = (*fetch)->device_chunks();
  figures->device_chunk_bytes = (*fetch)->device_chunk_bytes();
  return cache.ValidateRestore((*fetch)->Views());
}

Result<std::vector<LayerSnapshot>> PrefixCache::FetchResharded(const LookupHit& hit,
                                                               engine::SessionCache& cache,
                                                               Request* figures) {
  const auto t_fetch = Clock::now();
  const std::uint32_t kv_heads = model_->config().attn.kv_heads * options_.tp.size;
  PC_ASSIGN_OR_RETURN(auto layers, FetchRankParts(*client_, hit, ShardedLayers(cache.plan()), kv_heads,
                                                  options_.tp.size, options_.tp.rank));
  figures->fetch_ms = MsSince(t_fetch);
  PC_RETURN_IF_ERROR(cache.ValidateRestore(layers));
  return layers;
}

Result<std::uint64_t> PrefixCache::RestoreSnapshots(ModelSession& session,
                                                    const std::vector<LayerSnapshot>& layers,
                                                    const LookupHit& hit, Request* figures) {
  const auto t_copy = Clock::now();
  PC_RETURN_IF_ERROR(session.cache->Restore(layers));  // validated already: a failure here is the device's
  PC_RETURN_IF_ERROR(model_->engine().device().Synchronize(engine::Lane::kCompute));
  figures->copy_ms = MsSince(t_copy);
  for (const LayerSnapshot& l : layers)
    figures->restored_bytes += engine::ViewFloats(ShapeOf(l)) * sizeof(float);
  return hit.length;
}

Result<std::uint64_t> PrefixCache::RestoreStaged(ModelSession& session, const StagedFetch& fetch,
                                                 const LookupHit& hit, Request* figures) {
  const auto t_copy = Clock::now();
  const std::vector<engine::LayerSnapshotView> views = fetch.Views();
  PC_RETURN_IF_ERROR(session.cache->Restore(
      views, device_staging_ ? engine::PlaneResidence::kDevice : engine::PlaneResidence::kHost));
  PC_RETURN_IF_ERROR(model_->engine().device().Synchronize(engine::Lane::kCompute));
  figures->copy_ms = MsSince(t_copy);
  for (const engine::LayerSnapshotView& v : views)
    figures->restored_bytes += engine::ViewFloats(engine::ShapeOfView(v)) * sizeof(float);
  return hit.length;
}

Result<std::uint64_t> PrefixCache::RestoreParts(ModelSession& session, const LookupHit& hit,
                                                Request* figures) {
  std::optional<StagedFetch> fetch;
  if (Status s = FetchOwnParts(hit, *session.cache, &fetch, figures); !s.ok()) {
    NoteFailure("restoring entry " + std::to_string(hit.id), s);
    return std::uint64_t{0};
  }
  PC_ASSIGN_OR_RETURN(const std::uint64_t len, RestoreStaged(session, *fetch, hit, figures));
  session.position = len;
  return len;
}

Result<std::uint64_t> PrefixCache::TryRestoreRank(ModelSession& session,
                                                  std::span<const std::uint32_t> tokens, Request* figures) {
  engine::SessionCache& cache = *session.cache;
  const auto t_lookup = Clock::now();
  PC_ASSIGN_OR_RETURN(auto agreed, AgreeOnHit(tokens));
  const LookupHit hit = agreed.first;
  const std::uint64_t shared = agreed.second;
  figures->lookup_ms = MsSince(t_lookup);
  figures->shared_tokens = shared;
  if (hit.id == 0) return std::uint64_t{0};
  // This rank's parts, validated; the ranks then agree on going ahead.
  std::optional<StagedFetch> fetch;
  Result<std::vector<LayerSnapshot>> resharded = std::vector<LayerSnapshot>{};
  Status mine = client_ == nullptr ? Status::Unavailable("no daemon on this rank") : Status::Ok();
  if (mine.ok() && hit.ranks % options_.tp.size == 0) {
    mine = FetchOwnParts(hit, cache, &fetch, figures);
  } else if (mine.ok()) {
    resharded = FetchResharded(hit, cache, figures);
    mine = resharded.status();
  }
  bool every = mine.ok();
  if (Collective* group = model_->collective(); group != nullptr) {
    PC_ASSIGN_OR_RETURN(every, AllRanksOk(*group, model_->engine().device(), mine.ok()));
  }
  if (!mine.ok())
    NoteFailure(
        "restoring entry " + std::to_string(hit.id) + " on TP rank " + std::to_string(options_.tp.rank),
        mine);
  if (!every) return std::uint64_t{0};
  const Result<std::uint64_t> restored = fetch ? RestoreStaged(session, *fetch, hit, figures)
                                               : RestoreSnapshots(session, *resharded, hit, figures);
  // Validated on every rank, so only a device fails here; then every rank
  // starts over, so that no rank goes on from a boundary the others lack.
  if (Collective* group = model_->collective(); group != nullptr) {
    PC_ASSIGN_OR_RETURN(every, AllRanksOk(*group, model_->engine().device(), restored.ok()));
    if (!every && restored.ok()) return Status::Aborted("TP restore: another rank failed while copying");
  }
  if (restored.ok()) session.position = hit.length;
  return restored;
}

}  // namespace primecache::model
