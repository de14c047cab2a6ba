// TpPrefixCache (serving/tp_prefix_cache.h).
#include "serving/tp_prefix_cache.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <random>
#include <string>
#include <variant>

#include "primecache/internal/rank_parts.h"
#include "primecache/internal/shard.h"
#include "serving/head_groups.h"

namespace primecache::model {
namespace {

// A fetched layer decoded into its snapshot (every byte checked by the codec).
Result<LayerSnapshot> DecodeFetched(const client::FetchedLayer& f) {
  PC_ASSIGN_OR_RETURN(LayerHeader header, ParseLayerHeader(f.data.header));
  EncodedLayer enc{std::move(header), {}};
  enc.chunks.reserve(f.data.chunks.size());
  for (const auto& c : f.data.chunks)
    enc.chunks.emplace_back(reinterpret_cast<const char*>(c.data()), c.size());
  return DecodeLayer(enc);
}

client::LayerData ToLayerData(const EncodedLayer& e) {
  client::LayerData d;
  const std::string h = SerializeLayerHeader(e.header);
  const auto* hb = reinterpret_cast<const std::byte*>(h.data());
  d.header.assign(hb, hb + h.size());
  for (const std::string& c : e.chunks) {
    const auto* cb = reinterpret_cast<const std::byte*>(c.data());
    d.chunks.emplace_back(cb, cb + c.size());
  }
  return d;
}

}  // namespace

TpPrefixCache::TpPrefixCache(TensorParallelModel* model, std::unique_ptr<client::Client> client,
                             client::ModelId model_id, TpPrefixCacheOptions options)
    : model_(model),
      client_(std::move(client)),
      model_id_(std::move(model_id)),
      options_(std::move(options)) {
  std::random_device rd;
  next_group_ =
      (std::uint64_t{rd()} << 32 | rd()) | 1;  // group tokens of this cache: never 0, unlikely shared
}

Result<TpRequest> TpPrefixCache::Prime(std::span<const std::uint32_t> prompt, bool all_logits) {
  const auto t0 = std::chrono::steady_clock::now();
  TpRequest r;
  PC_ASSIGN_OR_RETURN(r.session, model_->NewSession());
  if (client_ != nullptr) {
    auto restored = TryRestore(r.session, prompt, &r.restored_ranks);
    if (!restored.ok()) {
      spdlog::warn("TP prefix cache: restore failed ({}); priming in full", restored.status().ToString());
      PC_ASSIGN_OR_RETURN(r.session,
                          model_->NewSession());  // a failed copy leaves no half-restored rank behind
      r.restored_ranks = 0;
    } else {
      r.restored_tokens = *restored;
    }
  }
  const auto rest = prompt.subspan(r.restored_tokens);
  r.prefilled_tokens = rest.size();
  std::vector<float> logits;
  PC_RETURN_IF_ERROR(
      model_->Prime(r.session, rest, all_logits ? LogitsWanted::kAll : LogitsWanted::kLast, &logits));
  const std::size_t V = model_->config().vocab;
  r.last_logits.assign(logits.end() - static_cast<std::ptrdiff_t>(V), logits.end());
  if (all_logits) r.all_logits = std::move(logits);
  r.ttft_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Result<std::vector<std::vector<LayerSnapshot>>> ShardsForTp(std::span<const client::FetchedLayer> fetched,
                                                            std::uint32_t stored_ranks,
                                                            std::uint32_t kv_heads, std::uint32_t tp) {
  std::vector<LayerSnapshot> layers;
  std::vector<LayerShape> shapes;
  for (const client::FetchedLayer& f : fetched) {
    auto one = DecodeFetched(f);
    if (!one.ok()) return one.status().WithContext("layer " + std::to_string(f.layer));
    shapes.push_back(ShapeOf(*one));
    layers.push_back(std::move(one).value());
  }
  PC_ASSIGN_OR_RETURN(auto parts, EntryLayerParts(shapes, stored_ranks));
  PC_ASSIGN_OR_RETURN(auto whole, GatherEntry(std::move(layers), parts));
  std::vector<std::vector<LayerSnapshot>> shards;
  for (std::uint32_t r = 0; r < tp; ++r) {
    PC_ASSIGN_OR_RETURN(auto mine, SliceLayers(whole, kv_heads, tp, r));
    shards.push_back(std::move(mine));
  }
  return shards;
}

std::vector<bool> ShardedLayers(const engine::StatePlan& plan) {
  std::vector<bool> sharded;
  for (const auto& layer : plan.layers) sharded.push_back(!std::holds_alternative<engine::LatentPlan>(layer));
  return sharded;
}

Result<std::vector<LayerSnapshot>> FetchRankParts(client::Client& c, const LookupHit& hit,
                                                  const std::vector<bool>& sharded, std::uint32_t kv_heads,
                                                  std::uint32_t tp, std::uint32_t rank) {
  PC_ASSIGN_OR_RETURN(RankPartsPlan plan, PlanRankParts(sharded, hit.layers, hit.ranks, tp, rank));
  PC_ASSIGN_OR_RETURN(auto fetched, c.FetchLayers(hit.id, plan.fetch));
  if (fetched.size() != plan.fetch.size()) {
    return Status::Corruption("entry " + std::to_string(hit.id) + ": " + std::to_string(fetched.size()) +
                            " layers fetched of " + std::to_string(plan.fetch.size()));
  }
  std::vector<LayerSnapshot> layers;
  for (std::size_t i = 0; i < fetched.size(); ++i) {
    if (fetched[i].layer != plan.fetch[i]) {
      return Status::Corruption("entry " + std::to_string(hit.id) + ": layer " + std::to_string(fetched[i].layer) +
                              " came where layer " + std::to_string(plan.fetch[i]) + " was asked for");
    }
    auto one = DecodeFetched(fetched[i]);
    if (!one.ok()) return one.status().WithContext("entry layer " + std::to_string(plan.fetch[i]));
    layers.push_back(std::move(one).value());
  }
  return AssembleRankParts(plan, std::move(layers), kv_heads);
}

namespace {

// Begins a part's publish (or an entry's, without a group) and streams its
// layers; not committed.
Result<std::unique_ptr<client::PublishStream>> StreamPart(client::Client& c, const client::ModelId& id,
                                                          std::span<const std::uint32_t> tokens,
                                                          std::span<const engine::LayerSnapshotView> layers,
                                                          const std::optional<PublishGroup>& group,
                                                          const EncodeOptions& encode) {
  PC_ASSIGN_OR_RETURN(auto stream,
                      c.BeginPublish(id, tokens, static_cast<std::uint32_t>(layers.size()), group));
  for (const engine::LayerSnapshotView& layer : layers) {
    PC_ASSIGN_OR_RETURN(EncodedLayer enc,
                        EncodeLayer(engine::ShapeOfView(layer), engine::PlanesOfView(layer), encode));
    const client::LayerData d = ToLayerData(enc);
    PC_RETURN_IF_ERROR(stream->BeginLayer(d.header, static_cast<std::uint32_t>(d.chunks.size())));
    for (const auto& chunk : d.chunks) PC_RETURN_IF_ERROR(stream->AddChunk(chunk));
  }
  return stream;
}

}  // namespace

Result<PublishResult> PublishRanks(client::Client& c, const client::ModelId& id,
                                   std::span<const std::uint32_t> tokens,
                                   std::vector<std::vector<LayerSnapshot>> ranks, std::uint32_t kv_heads,
                                   std::uint64_t token, const EncodeOptions& encode) {
  const auto tp = static_cast<std::uint32_t>(ranks.size());
  if (tp == 0) return Status::InvalidArgument("TP publish: no ranks");
  if (tp == 1) {
    PC_ASSIGN_OR_RETURN(auto alone,
                        StreamPart(c, id, tokens, engine::ViewsOf(ranks[0]), std::nullopt, encode));
    return alone->Commit();
  }
  if (kv_heads % tp != 0) {
    return Status::InvalidArgument("TP publish: TP " + std::to_string(tp) + " does not divide " +
                                   std::to_string(kv_heads) + " kv heads");
  }
  // Each part is streamed and committed (it waits, parked), the last rank's
  // first and part 0 last, whose commit writes the entry: one publish in
  // flight on the connection at a time. A part that fails to stream is
  // abandoned, which aborts the group at once and hands back the parked
  // parts.
  for (std::uint32_t r = tp; r-- > 0;) {
    const std::vector<engine::LayerSnapshotView> views = engine::ViewsOf(ranks[r]);
    PC_ASSIGN_OR_RETURN(std::vector<GroupPart> parts, RankGroupParts(views, kv_heads / tp, tp, r, token));
    for (const GroupPart& part : parts) {
      PC_ASSIGN_OR_RETURN(auto stream, StreamPart(c, id, tokens, part.layers, part.group, encode));
      PC_ASSIGN_OR_RETURN(PublishResult result, stream->Commit());
      if (part.group.rank == 0 || result.existed) return result;  // stored meanwhile: nothing more to send
    }
  }
  return Status::Internal("TP publish: unreachable");
}

Result<std::uint64_t> TpPrefixCache::TryRestore(TpSession& session, std::span<const std::uint32_t> tokens,
                                                std::uint32_t* ranks) {
  // Leave a position to prime: the prompt's last logits come from it.
  if (tokens.size() < 2) return std::uint64_t{0};
  PC_ASSIGN_OR_RETURN(auto hit, client_->Lookup(model_id_, tokens.first(tokens.size() - 1)));
  if (!hit || hit->length < options_.min_prefix) return std::uint64_t{0};
  PC_ASSIGN_OR_RETURN(auto fetched, client_->FetchLayers(hit->id));
  auto shards = ShardsForTp(fetched, hit->ranks, model_->config().attn.kv_heads, model_->tp());
  if (!shards.ok()) return shards.status().WithContext("entry " + std::to_string(hit->id));
  Status restored = model_->Restore(session, *shards, hit->length);
  if (!restored.ok()) {
    bool fresh = true;
    for (const ModelSession& s : session.ranks) fresh = fresh && s.cache->fresh();
    if (!fresh) return restored;  // failed while copying: the caller starts over
    spdlog::warn("TP prefix cache: entry {} refused: {}", hit->id, restored.ToString());
    return std::uint64_t{0};
  }
  *ranks = hit->ranks;
  return hit->length;
}

Result<PublishResult> TpPrefixCache::Publish(TpSession& session, std::span<const std::uint32_t> tokens) {
  if (client_ == nullptr) return Status::FailedPrecondition("TP prefix cache: no daemon");
  if (tokens.size() != session.position()) {
    return Status::InvalidArgument("TP prefix cache: " + std::to_string(tokens.size()) +
                                   " tokens for a session at " + std::to_string(session.position()));
  }
  PC_ASSIGN_OR_RETURN(auto ranks, model_->CaptureFull(session));
  const std::uint64_t token = next_group_++;
  if (next_group_ == 0) next_group_ = 1;
  return PublishRanks(*client_, model_id_, tokens, std::move(ranks), model_->config().attn.kv_heads, token,
                      options_.encode);
}

}  // namespace primecache::model
