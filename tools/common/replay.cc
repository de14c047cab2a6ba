#include "tools/common/replay.h"

#include <algorithm>
#include <unordered_set>

#include "primecache/internal/codec.h"
#include "primecache/internal/snapshot.h"

namespace primecache::replay {

namespace {

std::uint64_t Mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// `n` floats in [-0.5, 0.5) drawn from `seed` (a linear congruential stream:
// cheap, since a replay fills millions of rows).
void FillRow(float* out, std::uint32_t n, std::uint64_t seed) {
  std::uint64_t x = Mix(seed);
  for (std::uint32_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = static_cast<float>(static_cast<double>(x >> 40) * 0x1.0p-24 - 0.5);
  }
}

// A running hash per token: row t depends on tokens [0, t] only.
std::vector<std::uint64_t> RunningHashes(std::span<const std::uint32_t> tokens) {
  std::vector<std::uint64_t> h(tokens.size());
  std::uint64_t x = 0x243F6A8885A308D3ull;
  for (std::size_t i = 0; i < tokens.size(); ++i) h[i] = x = Mix(x ^ tokens[i]);
  return h;
}

LatentSnapshot LatentCacheLayer(const StateGeometry& g, const std::vector<std::uint64_t>& h, std::uint32_t l) {
  LatentSnapshot s;
  const std::uint64_t len = h.size();
  s.shape.len = len;
  s.shape.width = g.latent_width;
  s.latent_rows.resize(len * g.latent_width);
  const std::uint64_t salt = 0x1000ull * (l + 1);
  for (std::uint64_t t = 0; t < len; ++t) FillRow(&s.latent_rows[t * g.latent_width], g.latent_width, h[t] + salt);
  if (g.index_head_dim == 0) return s;
  s.shape.index_width = 2 * g.index_head_dim;
  s.shape.pool = g.pool;
  s.shape.pools_ready = len / g.pool;
  const std::uint64_t first_tail = s.shape.pools_ready * g.pool;
  s.index_tail_rows.resize((len - first_tail) * s.shape.index_width);
  for (std::uint64_t t = first_tail; t < len; ++t)
    FillRow(&s.index_tail_rows[(t - first_tail) * s.shape.index_width], s.shape.index_width, h[t] + salt + 1);
  s.pool_keys.resize(s.shape.pools_ready * g.index_head_dim);
  for (std::uint64_t p = 0; p < s.shape.pools_ready; ++p)
    FillRow(&s.pool_keys[p * g.index_head_dim], g.index_head_dim, h[(p + 1) * g.pool - 1] + salt + 2);
  return s;
}

RecurrentSnapshot RecurrentCacheLayer(const StateGeometry& g, std::uint64_t at, std::uint32_t l) {
  RecurrentSnapshot s{{g.heads, g.head_dim, g.kernel}, {}, {}};
  s.conv_ring.resize(3ull * g.heads * g.head_dim * (g.kernel - 1));
  s.state.resize(std::uint64_t{g.heads} * g.head_dim * g.head_dim);
  FillRow(s.conv_ring.data(), static_cast<std::uint32_t>(s.conv_ring.size()), at + 0x7000ull * (l + 1));
  FillRow(s.state.data(), static_cast<std::uint32_t>(s.state.size()), at + 0x7000ull * (l + 1) + 1);
  return s;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

// Which block-aligned prefixes earlier requests had (the client-side view an
// engine keeps to find branch points; tokens only, no state).
class PrefixTracker {
 public:
  static constexpr std::size_t kBlock = 32;
  // The longest multiple of kBlock that an earlier request shares.
  std::uint64_t LongestShared(std::span<const std::uint32_t> tokens) const {
    std::uint64_t h = 0, best = 0;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      h = Mix(h ^ tokens[i]);
      if ((i + 1) % kBlock != 0) continue;
      if (seen_.count(h) == 0) break;
      best = i + 1;
    }
    return best;
  }
  void Add(std::span<const std::uint32_t> tokens) {
    std::uint64_t h = 0;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      h = Mix(h ^ tokens[i]);
      if ((i + 1) % kBlock == 0) seen_.insert(h);
    }
  }

 private:
  std::unordered_set<std::uint64_t> seen_;
};

}  // namespace

std::uint64_t StateGeometry::RealBytes(std::uint64_t tokens) const {
  std::uint64_t latent = tokens * latent_width;
  if (index_head_dim > 0) {
    const std::uint64_t pools = tokens / pool;
    latent += pools * index_head_dim + (tokens - pools * pool) * 2 * index_head_dim;
  }
  const std::uint64_t recurrent = 3ull * heads * head_dim * (kernel - 1) + std::uint64_t{heads} * head_dim * head_dim;
  return (latent * latent_layers + recurrent * recurrent_layers) * sizeof(float) * scale;
}

Result<StateGeometry> GeometryFor(const model::ModelConfig& c, std::uint32_t scale) {
  if (scale == 0) return Status::InvalidArgument("scale must be >= 1");
  StateGeometry g;
  g.model = c.name;
  g.scale = scale;
  for (model::LayerType t : c.layers) {
    if (t == model::LayerType::kAttn)
      return Status::NotSupported("model " + c.name + ": attn layers are not replayed (MLA and KDA only)");
    (t == model::LayerType::kMla ? g.latent_layers : g.recurrent_layers)++;
  }
  auto divide = [&](std::uint32_t v, const char* what) -> Result<std::uint32_t> {
    if (v % scale != 0)
      return Status::InvalidArgument(std::string(what) + " " + std::to_string(v) + " is not a multiple of --scale " +
                                     std::to_string(scale));
    return v / scale;
  };
  if (g.latent_layers > 0) {
    PC_ASSIGN_OR_RETURN(std::uint32_t rank, divide(c.mla.kv_rank, "kv_rank"));
    PC_ASSIGN_OR_RETURN(std::uint32_t rope, divide(c.mla.rope_dim, "rope_dim"));
    g.latent_width = rank + rope;
    if (c.mla.indexer) {
      PC_ASSIGN_OR_RETURN(g.index_head_dim, divide(c.mla.indexer->head_dim, "indexer head_dim"));
      g.pool = c.mla.indexer->pool;
    }
  }
  if (g.recurrent_layers > 0) {
    PC_ASSIGN_OR_RETURN(g.heads, divide(c.kda.heads, "kda heads"));
    g.head_dim = c.kda.head_dim;
    g.kernel = c.kda.conv_kernel;
  }
  g.chunk_bytes = std::max<std::uint64_t>(4096, kDefaultChunkBytes / scale);
  g.cost = model::PrefillCost(c);
  return g;
}

std::vector<LayerBytes> EncodeBoundary(const StateGeometry& g, std::span<const std::uint32_t> tokens) {
  const std::vector<std::uint64_t> h = RunningHashes(tokens);
  EncodeOptions eo;
  eo.all_planes = TransformSpec{"raw/v1", 0};
  eo.target_chunk_bytes = g.chunk_bytes;
  std::vector<LayerBytes> out;
  auto push = [&](const LayerSnapshot& snap) {
    auto enc = EncodeLayer(snap, eo);
    if (!enc.ok()) return;  // cannot happen for these shapes; the store then refuses the publish
    out.push_back({SerializeLayerHeader(enc->header), std::move(enc->chunks)});
  };
  for (std::uint32_t l = 0; l < g.latent_layers; ++l) push(LatentCacheLayer(g, h, l));
  for (std::uint32_t l = 0; l < g.recurrent_layers; ++l) push(RecurrentCacheLayer(g, h.empty() ? 0 : h.back(), l));
  return out;
}

// ---- the store in process -----------------------------------------------------------------

PublishRequest StoreTarget::RequestFor(std::span<const std::uint32_t> tokens) const {
  PublishRequest r;
  r.model = Checksum128(std::as_bytes(std::span(g_.model.data(), g_.model.size())));
  r.model_name = g_.model;
  r.tokens.assign(tokens.begin(), tokens.end());
  if (send_cost_) r.cost = g_.cost;
  return r;
}

Result<std::uint64_t> StoreTarget::Lookup(std::span<const std::uint32_t> tokens) {
  const PublishRequest r = RequestFor({});
  PC_ASSIGN_OR_RETURN(std::optional<LookupHit> hit, store_->Lookup(r.model, r.ns, tokens));
  return hit ? hit->length : 0;
}

Result<std::optional<PublishResult>> StoreTarget::Publish(std::span<const std::uint32_t> tokens,
                                                          const std::vector<LayerBytes>& layers) {
  auto r = store_->Publish(RequestFor(tokens), layers);
  if (r.status().code() == StatusCode::kAborted) return std::optional<PublishResult>();
  PC_RETURN_IF_ERROR(r.status());
  return std::optional<PublishResult>(*r);
}

Result<std::uint64_t> StoreTarget::StoredBytes() {
  PC_ASSIGN_OR_RETURN(StoreStats st, store_->Stat());
  return st.stored_bytes;
}

// ---- the replay -----------------------------------------------------------------------------

namespace {

struct Publisher {
  const StateGeometry& g;
  Target& target;
  const ReplayOptions& o;
  ReplayResult& r;

  Status Boundary(std::span<const std::uint32_t> tokens) {
    ++r.publishes;
    auto res = target.Publish(tokens, EncodeBoundary(g, tokens));
    if (res.status().code() == StatusCode::kResourceExhausted) {
      ++r.failed;  // nothing evictable was left
      return Status::Ok();
    }
    PC_RETURN_IF_ERROR(res.status());
    if (!res->has_value()) {
      ++r.refused;
      return Status::Ok();
    }
    r.bytes_written += (*res)->new_chunk_bytes * g.scale;
    r.evictions += (*res)->evicted;
    PC_ASSIGN_OR_RETURN(std::uint64_t stored, target.StoredBytes());
    r.peak_stored_bytes = std::max(r.peak_stored_bytes, stored * g.scale);
    if (o.budget_real_bytes > 0 && stored * g.scale > o.budget_real_bytes) ++r.over_budget;
    return Status::Ok();
  }
};

}  // namespace

Result<ReplayResult> Replay(const traces::Trace& trace, const StateGeometry& g, Target& target,
                            const ReplayOptions& o) {
  const double flops_rate = o.prefill_flops_per_s > 0
                                ? o.prefill_flops_per_s
                                : EstimatePrefillFlops(g.cost, 32768) / (32768 / o.prefill_tokens_per_s);
  ReplayResult r;
  Publisher pub{g, target, o, r};
  PrefixTracker seen;
  std::vector<double> ttft;
  double nocache_ms = 0;
  for (const traces::Request& q : trace.requests) {
    std::span<const std::uint32_t> tokens(q.tokens);
    PC_ASSIGN_OR_RETURN(std::uint64_t hit, target.Lookup(tokens));
    const double full = EstimatePrefillFlops(g.cost, tokens.size());
    const double saved = hit > 0 ? EstimatePrefillFlops(g.cost, hit) : 0;
    ++r.requests;
    r.prompt_tokens += tokens.size();
    r.hit_tokens += hit;
    r.hits += hit > 0 ? 1 : 0;
    r.prefill_flops += full;
    r.flops_saved += saved;
    r.hit_lengths.push_back(hit);
    const double restore_s = hit > 0 ? static_cast<double>(g.RealBytes(hit)) / o.restore_bytes_per_s : 0;
    ttft.push_back(1e3 * (restore_s + (full - saved) / flops_rate));
    nocache_ms += 1e3 * full / flops_rate;
    const std::uint64_t branch = seen.LongestShared(tokens);
    if (o.boundaries == Boundaries::kEndAndBranch && branch > hit && branch < tokens.size())
      PC_RETURN_IF_ERROR(pub.Boundary(tokens.first(branch)));
    PC_RETURN_IF_ERROR(pub.Boundary(tokens));
    seen.Add(tokens);
  }
  double sum = 0;
  for (double t : ttft) sum += t;
  r.ttft_mean_ms = ttft.empty() ? 0 : sum / static_cast<double>(ttft.size());
  r.ttft_p95_ms = Percentile(ttft, 0.95);
  r.ttft_nocache_mean_ms = r.requests ? nocache_ms / static_cast<double>(r.requests) : 0;
  return r;
}

}  // namespace primecache::replay
