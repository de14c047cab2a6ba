// Shared helpers of the statestore tests: real encoded layers ([codecs]) of a
// small hybrid model at a boundary, derived from the tokens so that two
// boundaries of one conversation share their leading rows exactly and two
// branches differ after the point where they diverge; temporary directories;
// store options on the in-memory Env.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/internal/codec.h"
#include "primecache/internal/env.h"
#include "primecache/internal/shard.h"
#include "primecache/internal/snapshot.h"
#include "primecache/internal/statestore.h"
#include "statestore/test_hooks.h"

namespace primecache::store_test {

inline std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline float ValueOf(std::uint64_t h, std::uint64_t c) {
  return static_cast<float>(static_cast<double>(Mix(h * 131 + c) >> 40) / static_cast<double>(1 << 24) - 0.5);
}

// The geometry of the small test model: MLA latent layers (with a DSA
// indexer) and KDA recurrent layers.
struct TestModel {
  std::uint32_t latent_layers = 2;
  std::uint32_t recurrent_layers = 1;
  std::uint32_t width = 16;          // latent floats per row
  std::uint32_t index_head_dim = 4;  // 0: no indexer
  std::uint32_t pool = 4;
  std::uint32_t heads = 2, head_dim = 4, kernel = 4;
  std::uint64_t chunk_bytes = 1024;  // the codec's target chunk size
  TransformSpec transform{"raw/v1", 0};
  std::uint64_t seed = 1;
};

// Row t of a layer depends on the tokens [0, t] only (a running hash), so
// rows are shared exactly by boundaries of one conversation.
inline std::vector<std::uint64_t> RunningHashes(const std::vector<std::uint32_t>& tokens,
                                                std::uint64_t seed) {
  std::vector<std::uint64_t> h(tokens.size());
  std::uint64_t x = seed;
  for (std::size_t i = 0; i < tokens.size(); ++i) h[i] = x = Mix(x ^ (tokens[i] + 0x100000000ull * i));
  return h;
}

inline std::vector<LayerBytes> MakeLayers(const std::vector<std::uint32_t>& tokens, const TestModel& m = {}) {
  auto h = RunningHashes(tokens, m.seed);
  const std::uint64_t len = tokens.size();
  EncodeOptions eo;
  eo.all_planes = m.transform;
  eo.target_chunk_bytes = m.chunk_bytes;
  std::vector<LayerBytes> out;
  auto push = [&](const LayerSnapshot& snap) {
    auto enc = EncodeLayer(snap, eo);
    EXPECT_TRUE(enc.ok()) << enc.status().ToString();
    if (!enc.ok()) return;
    out.push_back({SerializeLayerHeader(enc->header), std::move(enc->chunks)});
  };
  for (std::uint32_t l = 0; l < m.latent_layers; ++l) {
    LatentSnapshot s;
    s.shape.len = len;
    s.shape.width = m.width;
    s.latent_rows.resize(len * m.width);
    for (std::uint64_t t = 0; t < len; ++t) {
      for (std::uint32_t c = 0; c < m.width; ++c) s.latent_rows[t * m.width + c] = ValueOf(h[t] + l, c);
    }
    if (m.index_head_dim > 0) {
      s.shape.index_width = 2 * m.index_head_dim;
      s.shape.pool = m.pool;
      s.shape.pools_ready = len / m.pool;
      std::uint64_t first_tail = s.shape.pools_ready * m.pool;
      for (std::uint64_t t = first_tail; t < len; ++t) {
        for (std::uint32_t c = 0; c < s.shape.index_width; ++c)
          s.index_tail_rows.push_back(ValueOf(h[t] + 100 + l, c));
      }
      for (std::uint64_t p = 0; p < s.shape.pools_ready; ++p) {
        std::uint64_t last = (p + 1) * m.pool - 1;
        for (std::uint32_t c = 0; c < m.index_head_dim; ++c)
          s.pool_keys.push_back(ValueOf(h[last] + 200 + l, c));
      }
    }
    push(s);
  }
  for (std::uint32_t l = 0; l < m.recurrent_layers; ++l) {
    RecurrentSnapshot s{{m.heads, m.head_dim, m.kernel}, {}, {}};
    std::uint64_t at = h.empty() ? 0 : h.back();
    s.conv_ring.resize(3ull * m.heads * m.head_dim * (m.kernel - 1));
    for (std::size_t i = 0; i < s.conv_ring.size(); ++i) s.conv_ring[i] = ValueOf(at + 300 + l, i);
    s.state.resize(std::uint64_t{m.heads} * m.head_dim * m.head_dim);
    for (std::size_t i = 0; i < s.state.size(); ++i) s.state[i] = ValueOf(at + 400 + l, i);
    push(s);
  }
  return out;
}

// The parts `ranks` TP ranks publish of the boundary MakeLayers encodes
// (PublishGroup's order): rank 0's every layer (the latent layers whole, its
// shard of each recurrent layer), then each later rank's recurrent shards.
// m.heads must be a multiple of `ranks`.
inline std::vector<std::vector<LayerBytes>> MakeGroupParts(const std::vector<std::uint32_t>& tokens,
                                                          std::uint32_t ranks, const TestModel& m = {}) {
  std::vector<std::vector<LayerBytes>> parts(ranks);
  EncodeOptions eo;
  eo.all_planes = m.transform;
  eo.target_chunk_bytes = m.chunk_bytes;
  for (const LayerBytes& whole : MakeLayers(tokens, m)) {
    auto header = ParseLayerHeader(AsBytes(whole.header));
    EXPECT_TRUE(header.ok()) << header.status().ToString();
    if (!header.ok()) return {};
    if (!std::holds_alternative<RecurrentShape>(header->shape)) {
      parts[0].push_back(whole);
      continue;
    }
    auto snapshot = DecodeLayer(EncodedLayer{*header, whole.chunks});
    EXPECT_TRUE(snapshot.ok()) << snapshot.status().ToString();
    if (!snapshot.ok()) return {};
    for (std::uint32_t r = 0; r < ranks; ++r) {
      auto shard = SliceRecurrent(std::get<RecurrentSnapshot>(*snapshot), ranks, r);
      EXPECT_TRUE(shard.ok()) << shard.status().ToString();
      if (!shard.ok()) return {};
      auto enc = EncodeLayer(LayerSnapshot{*shard}, eo);
      EXPECT_TRUE(enc.ok()) << enc.status().ToString();
      if (!enc.ok()) return {};
      parts[r].push_back({SerializeLayerHeader(enc->header), std::move(enc->chunks)});
    }
  }
  return parts;
}

// A group entry's layers as the store keeps them: the parts in rank order.
inline std::vector<LayerBytes> Concat(const std::vector<std::vector<LayerBytes>>& parts) {
  std::vector<LayerBytes> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

inline std::uint64_t LayerBytesSize(const std::vector<LayerBytes>& layers) {
  std::uint64_t n = 0;
  for (const auto& l : layers) {
    for (const auto& c : l.chunks) n += c.size();
  }
  return n;
}

// Tokens of a conversation: `n` tokens drawn from `seed`.
inline std::vector<std::uint32_t> Conversation(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint32_t>(Mix(seed * 1000003 + i) % 50000);
  return t;
}

inline std::vector<std::uint32_t> Prefix(const std::vector<std::uint32_t>& t, std::size_t n) {
  return {t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n)};
}

// `base` up to `at`, then tokens of another conversation.
inline std::vector<std::uint32_t> DivergeAt(const std::vector<std::uint32_t>& base, std::size_t at, std::size_t n,
                                            std::uint64_t seed) {
  std::vector<std::uint32_t> t = Prefix(base, at);
  for (std::uint32_t x : Conversation(n - at, seed)) t.push_back(x);
  if (t[at] == base[at]) t[at] ^= 1;  // they differ exactly at `at`
  return t;
}

// The longest prefix of `query` that any of `stored` shares token for token
// (the branch point a lookup must answer, worked out by brute force).
inline std::uint64_t LongestSharedPrefix(const std::vector<std::uint32_t>& query,
                                         const std::vector<std::vector<std::uint32_t>>& stored) {
  std::uint64_t best = 0;
  for (const auto& s : stored) {
    const auto m = std::mismatch(query.begin(), query.end(), s.begin(), s.end());
    best = std::max<std::uint64_t>(best, static_cast<std::uint64_t>(m.first - query.begin()));
  }
  return best;
}

inline Hash128 ModelDigest(std::uint64_t n) {
  return Hash128{Mix(n), Mix(n + 1)};
}

inline PublishRequest Request(const std::vector<std::uint32_t>& tokens, std::uint64_t model = 1,
                              std::string ns = "") {
  PublishRequest r;
  r.model = ModelDigest(model);
  r.model_name = "test-model-" + std::to_string(model);
  r.ns = std::move(ns);
  r.tokens = tokens;
  r.cost = {1000, 2, 64};
  return r;
}

// Options of a store that checks layers as the daemon's store does.
inline StoreOptions CodecStoreOptions() {
  StoreOptions o;
  o.validator = CodecLayerValidator();
  return o;
}

// A store on a fresh in-memory Env (with test knobs when `h` is set).
struct MemStore {
  std::unique_ptr<Env> env = NewMemEnv();
  StoreOptions options;
  std::shared_ptr<const statestore_internal::TestHooks> hooks;
  std::unique_ptr<LocalStore> store;

  explicit MemStore(StoreOptions o = CodecStoreOptions(), std::shared_ptr<const statestore_internal::TestHooks> h = nullptr)
      : options(std::move(o)), hooks(std::move(h)) {
    options.env = env.get();
    if (options.path.empty()) options.path = "/store";
    Reopen();
  }
  void Reopen() {
    store.reset();
    auto s = statestore_internal::OpenWithHooks(options, hooks);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store = std::move(s).value();
  }
};

// A temporary directory on the real file system, removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/primecache-store-XXXXXX";
    char* p = ::mkdtemp(tmpl);
    EXPECT_NE(p, nullptr);
    path = p != nullptr ? p : "/tmp/primecache-store-failed";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// The stored tokens of a live entry, as Describe gives them.
inline Result<std::vector<std::uint32_t>> StoredTokens(Store& s, EntryId id) {
  PC_ASSIGN_OR_RETURN(EntryDetail d, s.Describe(id));
  return std::move(d.info.tokens);
}

inline EntryId MustPublish(LocalStore& s, const std::vector<std::uint32_t>& tokens, std::uint64_t model = 1,
                           const std::string& ns = "", const TestModel& m = {}) {
  auto layers = MakeLayers(tokens, m);
  auto r = s.Publish(Request(tokens, model, ns), layers);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->id : 0;
}

// The descriptor of a model (named `architecture`) whose plan is these
// layers' (any of its entries: the plan does not depend on the length).
inline std::string DescriptorFor(const std::vector<LayerBytes>& layers, std::string architecture = "store-model") {
  std::vector<LayerShape> shapes;
  for (const LayerBytes& l : layers) {
    auto h = ParseLayerHeader(AsBytes(l.header));
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (h.ok()) shapes.push_back(h->shape);
  }
  ModelFingerprint fp;
  fp.architecture = std::move(architecture);
  fp.plan_digest = PlanDigest(shapes);
  fp.codec_versions = CodecRegistry::Default().Identities();
  return EncodeFingerprint(fp);
}

inline void ExpectConsistent(LocalStore& s) {
  auto v = s.CheckStore({.read_chunks = true});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  for (const auto& p : v->problems) ADD_FAILURE() << "verify: " << p;
}

inline void ExpectSameLayers(const std::vector<LayerBytes>& a, const std::vector<LayerBytes>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].header, b[i].header) << "layer " << i;
    EXPECT_EQ(a[i].chunks, b[i].chunks) << "layer " << i;
  }
}

}  // namespace primecache::store_test
