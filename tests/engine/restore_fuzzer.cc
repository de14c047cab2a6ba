// libFuzzer target: restore validation. An input picks a source geometry, a
// target geometry, a boundary length and a feeding pattern (the call seed);
// the source is a real CPU session of that geometry fed in calls of the
// pattern's sizes and captured in full at a call boundary; the rest of the
// input is a list of mutations of that snapshot (any field set to any value,
// planes resized, bits flipped, layers swapped, dropped, duplicated or
// replaced). The mutated snapshot is offered to a fresh session of the target
// geometry:
//  - refused: the cache is left exactly as it was (fresh, every layer empty,
//    its invariants held, every arena byte as when it was handed out);
//  - restored: every invariant holds, a full capture gives back the offered
//    snapshot, and the session takes further tokens;
//  - an unmutated snapshot offered to its own geometry is restored.
// Sources are primed once per (geometry, call seed), on first use: the
// session is fed up to its max_ctx in the pattern's calls and captured in
// full at every call boundary on the way, and those captures serve later
// inputs (the oldest dropped past World::kSourceBytes). The input's length
// picks the last boundary at or below it (the first when it is below that
// one). A target session that refused stays fresh (each refusal checks it) and
// takes the next offer to its geometry; one that restored is replaced.
// Input layout: [source][target][len][call seed] then 6-byte records
// [op][layer][value u32 little-endian].
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "engine/device.h"
#include "engine/engine_core.h"
#include "primecache/internal/engine.h"

using namespace primecache;
using namespace primecache::engine;

namespace {

#define PC_FUZZ_CHECK(cond)        \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

struct Geometry {
  StatePlan plan;
  std::uint64_t max_ctx, ring;
};

std::vector<Geometry> Geometries() {
  const StatePlan hybrid{
      {LatentPlan{16, 8, 8, 4}, RecurrentShape{2, 4, 4}, LatentPlan{24, 0, 0, 0}, KvPlan{6, 10}}};
  const StatePlan pool2{
      {LatentPlan{16, 8, 8, 2}, RecurrentShape{2, 4, 4}, LatentPlan{24, 0, 0, 0}, KvPlan{6, 10}}};
  return {
      {hybrid, 128, 8},
      {hybrid, 128, 0},
      {hybrid, 128, 13},
      {pool2, 128, 8},
      {StatePlan{{LatentPlan{8, 0, 4, 3}, RecurrentShape{1, 2, 2}}}, 96, 6},
      {StatePlan{{KvPlan{4, 4}, LatentPlan{16, 8, 8, 4}}}, 64, 0},
  };
}

// Deterministic filler.
struct Rng {
  std::uint64_t s;
  float Next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<float>(static_cast<std::int64_t>(s % 2001) - 1000) / 250.0f;
  }
  std::vector<float> Rows(std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = Next();
    return v;
  }
};

struct Buffer {
  Memory mem;
  Buffer(Device& d, const std::vector<float>& v) {
    auto m = d.Allocate(v.size() * sizeof(float));
    PC_FUZZ_CHECK(m.ok());
    mem = std::move(m).value();
    PC_FUZZ_CHECK(d.Upload(mem.data(), v.data(), v.size() * sizeof(float), Lane::kCompute).ok());
  }
  float* get() const { return static_cast<float*>(mem.data()); }
};

// Feeds `count` tokens to every layer of a session.
Status Feed(Device& d, SessionCache& s, Rng& rng, std::uint64_t count) {
  for (std::size_t i = 0; i < s.layer_count(); ++i) {
    if (LatentCacheLayer* l = s.latent(i)) {
      const LatentPlan& p = l->plan();
      Buffer rows(d, rng.Rows(count * p.width())), idx(d, rng.Rows(count * p.index_width() + 1));
      Buffer ape(d, rng.Rows(std::size_t{p.pool} * p.index_head_dim + 1));
      IndexerInputs ix{p.pool, ape.get()};
      PC_RETURN_IF_ERROR(l->Append(rows.get(), p.has_indexer() ? idx.get() : nullptr, count,
                                   p.has_indexer() ? &ix : nullptr));
    } else if (RecurrentCacheLayer* r = s.recurrent(i)) {
      const std::vector<float> next = rng.Rows(r->plan().state_values());
      PC_RETURN_IF_ERROR(d.Upload(r->next_state(), next.data(), next.size() * sizeof(float), Lane::kCompute));
      Buffer in(d, rng.Rows(count * r->plan().conv_channels()));
      PC_RETURN_IF_ERROR(r->Step(in.get(), count));
    } else if (KvCacheLayer* kv = s.kv(i)) {
      Buffer k(d, rng.Rows(count * kv->plan().k_width)), v(d, rng.Rows(count * kv->plan().v_width));
      PC_RETURN_IF_ERROR(kv->Append(k.get(), v.get(), count));
    }
  }
  return Status::Ok();
}

// One source geometry fed under one call seed: the full capture at every call
// boundary, in order of length.
struct Source {
  std::vector<std::uint64_t> lens;
  std::vector<std::vector<LayerSnapshot>> snaps;
};

// Feeds a fresh session of the source's geometry up to its max_ctx, in calls
// of 1 + (seed + done) % 37 tokens, capturing in full after each call.
std::unique_ptr<Source> Prime(Device& d, Engine& engine, std::uint64_t max_ctx, std::uint8_t seed) {
  auto src = engine.NewSession();
  PC_FUZZ_CHECK(src.ok());
  auto out = std::make_unique<Source>();
  Rng rng{0x9e3779b97f4a7c15ull ^ seed};
  for (std::uint64_t done = 0; done < max_ctx;) {
    const std::uint64_t t = std::min<std::uint64_t>(max_ctx - done, 1 + (seed + done) % 37);
    PC_FUZZ_CHECK(Feed(d, *src.value(), rng, t).ok());
    done += t;
    auto full = src.value()->CaptureFull();
    PC_FUZZ_CHECK(full.ok());
    out->lens.push_back(done);
    out->snaps.push_back(std::move(full).value());
  }
  return out;
}

std::size_t SnapshotBytes(const std::vector<LayerSnapshot>& snap) {
  std::size_t floats = 0;
  for (const LayerSnapshot& l : snap) {
    if (const auto* x = std::get_if<LatentSnapshot>(&l)) {
      floats += x->latent_rows.size() + x->index_tail_rows.size() + x->pool_keys.size();
    } else if (const auto* r = std::get_if<RecurrentSnapshot>(&l)) {
      floats += r->conv_ring.size() + r->state.size();
    } else {
      const auto& kv = std::get<KvSnapshot>(l);
      floats += kv.k_rows.size() + kv.v_rows.size();
    }
  }
  return floats * sizeof(float);
}

// Downloads every byte of `m` into `out` (resized to fit, its storage kept).
void Bytes(Device& d, const Memory& m, std::vector<std::byte>& out) {
  out.resize(m.bytes());
  PC_FUZZ_CHECK(d.Download(out.data(), m.data(), m.bytes(), Lane::kCompute).ok());
}

// A fresh session of a target geometry and its arena's bytes when it was
// handed out. A session that refused every offer so far is still fresh with
// those bytes (each refusal checks it), so it takes the next input's offer;
// one that restored is handed back and replaced. This spares each refused
// input a session's zeroing on hand-back and an arena download (an arena is
// a few MiB).
struct Target {
  std::unique_ptr<SessionCache> session;
  std::vector<std::byte> before;
};

struct World {
  std::shared_ptr<Device> dev = NewCpuDevice({.memory_bytes = 256ull << 20});
  std::vector<Geometry> geometries = Geometries();
  std::vector<std::unique_ptr<Engine>> engines;
  // sources[geometry][seed], primed on first use; the oldest primed are
  // dropped (and primed again when next asked for) past kSourceBytes.
  static constexpr std::size_t kSourceBytes = 96u << 20;
  std::vector<std::array<std::unique_ptr<Source>, 256>> sources;
  std::vector<std::pair<std::size_t, std::uint8_t>> primed;  // in priming order
  std::size_t primed_head = 0, source_bytes = 0;
  std::vector<Target> targets;
  World() : sources(geometries.size()), targets(geometries.size()) {
    for (const Geometry& g : geometries) {
      auto e = Engine::Create(dev, ReserveRequest{g.plan, g.max_ctx, 2, 0, g.ring});
      PC_FUZZ_CHECK(e.ok());
      engines.push_back(std::move(e).value());
    }
  }
  // The capture of geometry g under `seed` at the last boundary at or below len.
  const std::vector<LayerSnapshot>& Snapshot(std::size_t g, std::uint8_t seed, std::uint64_t len) {
    std::unique_ptr<Source>& s = sources[g][seed];
    if (!s) {
      while (source_bytes > kSourceBytes && primed_head < primed.size()) {
        auto [og, oseed] = primed[primed_head++];
        for (const auto& snap : sources[og][oseed]->snaps) source_bytes -= SnapshotBytes(snap);
        sources[og][oseed].reset();
      }
      s = Prime(*dev, *engines[g], geometries[g].max_ctx, seed);
      for (const auto& snap : s->snaps) source_bytes += SnapshotBytes(snap);
      primed.emplace_back(g, seed);
    }
    const auto above = std::upper_bound(s->lens.begin(), s->lens.end(), len);
    const std::size_t at =
        above == s->lens.begin() ? 0 : static_cast<std::size_t>(above - s->lens.begin()) - 1;
    return s->snaps[at];
  }
  Target& FreshTarget(std::size_t g) {
    Target& t = targets[g];
    if (!t.session) {
      auto opened = engines[g]->NewSession();
      PC_FUZZ_CHECK(opened.ok());
      t.session = std::move(opened).value();
      Bytes(*dev, EngineInternals::Arena(*t.session), t.before);
    }
    return t;
  }
};

std::vector<float>* Plane(LayerSnapshot& l, std::uint32_t which) {
  if (auto* x = std::get_if<LatentSnapshot>(&l)) {
    std::vector<float>* p[] = {&x->latent_rows, &x->index_tail_rows, &x->pool_keys};
    return p[which % 3];
  }
  if (auto* r = std::get_if<RecurrentSnapshot>(&l)) return which % 2 ? &r->state : &r->conv_ring;
  auto& kv = std::get<KvSnapshot>(l);
  return which % 2 ? &kv.v_rows : &kv.k_rows;
}

void Mutate(std::vector<LayerSnapshot>& s, std::uint8_t op, std::uint8_t layer, std::uint32_t v) {
  if (s.empty()) {
    if (op % 20 == 17) s.emplace_back(KvSnapshot{});
    return;
  }
  LayerSnapshot& l = s[layer % s.size()];
  auto* lat = std::get_if<LatentSnapshot>(&l);
  auto* rec = std::get_if<RecurrentSnapshot>(&l);
  auto* kv = std::get_if<KvSnapshot>(&l);
  switch (op % 20) {
    case 0:
      if (lat) lat->shape.len = v;
      if (kv) kv->shape.len = v;
      if (rec) rec->shape.heads = v;
      break;
    case 1:
      if (lat) lat->shape.width = v;
      if (kv) kv->shape.k_width = v;
      if (rec) rec->shape.head_dim = v;
      break;
    case 2:
      if (lat) lat->shape.index_width = v;
      if (kv) kv->shape.v_width = v;
      if (rec) rec->shape.kernel = v;
      break;
    case 3:
      if (lat) lat->shape.pool = v;
      break;
    case 4:
      if (lat) lat->shape.pools_ready = v;
      break;
    case 5:
      if (lat) lat->shape.index_is_ring = !lat->shape.index_is_ring;
      break;
    case 6:
      if (lat) lat->shape.index_ring_rows = v;
      break;
    case 7:
    case 8:
    case 9:
      Plane(l, op % 20 - 7)->resize(v % 8192);
      break;
    case 10:
    case 11:
    case 12: {
      std::vector<float>* p = Plane(l, op % 20 - 10);
      if (!p->empty()) {
        std::uint32_t bits;
        std::memcpy(&bits, &(*p)[(v >> 5) % p->size()], 4);
        bits ^= 1u << (v & 31);
        std::memcpy(&(*p)[(v >> 5) % p->size()], &bits, 4);
      }
      break;
    }
    case 13:  // a len that is consistent with the planes' sizes again
      if (lat && lat->shape.width != 0) lat->shape.len = lat->latent_rows.size() / lat->shape.width;
      if (lat && lat->shape.pool != 0) lat->shape.pools_ready = lat->shape.len / lat->shape.pool;
      if (kv && kv->shape.k_width != 0) kv->shape.len = kv->k_rows.size() / kv->shape.k_width;
      break;
    case 14:
      std::swap(l, s[v % s.size()]);
      break;
    case 15:
      s.erase(s.begin() + static_cast<std::ptrdiff_t>(layer % s.size()));
      break;
    case 16:
      s.insert(s.begin() + static_cast<std::ptrdiff_t>(v % (s.size() + 1)), LayerSnapshot(l));
      break;
    case 17:
      if (v % 3 == 0) l = LatentSnapshot{};
      if (v % 3 == 1) l = RecurrentSnapshot{};
      if (v % 3 == 2) l = KvSnapshot{};
      break;
    case 18:  // a 64-bit field set far out of range
      if (lat) lat->shape.len = (std::uint64_t{v} << 32) | v;
      if (kv) kv->shape.len = (std::uint64_t{v} << 32) | v;
      if (lat && v % 2) lat->shape.pools_ready = (std::uint64_t{v} << 32);
      break;
    default:
      if (lat) lat->shape.index_ring_rows = (std::uint64_t{v} << 32) | v;
      break;
  }
}

bool SameLayer(const LayerSnapshot& a, const LayerSnapshot& b) {
  auto eq = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * 4) == 0);
  };
  if (a.index() != b.index()) return false;
  if (const auto* x = std::get_if<LatentSnapshot>(&a)) {
    const auto& y = std::get<LatentSnapshot>(b);
    // Ring or flat may differ: a ring snapshot restores into a flat plane.
    const LatentShape &xs = x->shape, &ys = y.shape;
    return xs.len == ys.len && xs.width == ys.width && xs.index_width == ys.index_width &&
           xs.pool == ys.pool && xs.pools_ready == ys.pools_ready && eq(x->latent_rows, y.latent_rows) &&
           eq(x->index_tail_rows, y.index_tail_rows) && eq(x->pool_keys, y.pool_keys);
  }
  if (const auto* r = std::get_if<RecurrentSnapshot>(&a)) {
    const auto& q = std::get<RecurrentSnapshot>(b);
    return r->shape == q.shape && eq(r->conv_ring, q.conv_ring) && eq(r->state, q.state);
  }
  const auto& k = std::get<KvSnapshot>(a);
  const auto& m = std::get<KvSnapshot>(b);
  return k.shape == m.shape && eq(k.k_rows, m.k_rows) && eq(k.v_rows, m.v_rows);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static World* world = new World();
  if (size < 4) return 0;
  Device& dev = *world->dev;
  const std::size_t src_i = data[0] % world->geometries.size();
  const std::size_t dst_i = data[1] % world->geometries.size();
  const std::uint64_t len = 1 + data[2] % world->geometries[src_i].max_ctx;

  // The source: a real session primed to the boundary (kept across inputs).
  std::vector<LayerSnapshot> snap = world->Snapshot(src_i, data[3], len);
  for (std::size_t at = 4; at + 6 <= size; at += 6) {
    std::uint32_t v;
    std::memcpy(&v, data + at + 2, 4);
    Mutate(snap, data[at], data[at + 1], v);
  }

  Target& target = world->FreshTarget(dst_i);
  SessionCache& dst = *target.session;
  const Status validated = dst.ValidateRestore(snap);
  const Status restored = dst.Restore(snap);
  PC_FUZZ_CHECK(validated.ok() == restored.ok());
  if (!restored.ok()) {
    PC_FUZZ_CHECK(!restored.message().empty());
    PC_FUZZ_CHECK(dst.fresh());
    PC_FUZZ_CHECK(dst.CheckInvariants().ok());
    for (std::size_t i = 0; i < dst.layer_count(); ++i) {
      if (const LatentCacheLayer* l = dst.latent(i)) PC_FUZZ_CHECK(l->len() == 0);
      if (const KvCacheLayer* k = dst.kv(i)) PC_FUZZ_CHECK(k->len() == 0);
    }
    // The CPU device's memory is host memory (its Download is a memmove), so
    // the arena is compared where it lies.
    const Memory& arena = EngineInternals::Arena(dst);
    PC_FUZZ_CHECK(arena.bytes() == target.before.size());
    PC_FUZZ_CHECK(std::memcmp(arena.data(), target.before.data(), target.before.size()) == 0);
    // What its own geometry captured, unchanged, it restores.
    PC_FUZZ_CHECK(!(src_i == dst_i && size < 10));
    return 0;
  }
  // Restored: this session is no longer fresh; the next input gets another.
  const std::unique_ptr<SessionCache> used = std::move(target.session);
  PC_FUZZ_CHECK(!dst.fresh());
  PC_FUZZ_CHECK(dst.CheckInvariants().ok());
  auto again = dst.CaptureFull();
  PC_FUZZ_CHECK(again.ok());
  PC_FUZZ_CHECK(again->size() == snap.size());
  for (std::size_t i = 0; i < snap.size(); ++i) PC_FUZZ_CHECK(SameLayer(snap[i], (*again)[i]));
  // The restored cache goes on like any other.
  Rng more{7};
  std::uint64_t room = world->geometries[dst_i].max_ctx;
  for (std::size_t i = 0; i < dst.layer_count(); ++i) {
    if (const LatentCacheLayer* l = dst.latent(i)) room = std::min(room, l->max_ctx() - l->len());
    if (const KvCacheLayer* k = dst.kv(i)) room = std::min(room, k->max_ctx() - k->len());
  }
  if (room > 0) {
    PC_FUZZ_CHECK(Feed(dev, dst, more, std::min<std::uint64_t>(room, 9)).ok());
    PC_FUZZ_CHECK(dst.CheckInvariants().ok());
  }
  return 0;
}
