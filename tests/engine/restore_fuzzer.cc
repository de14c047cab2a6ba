// libFuzzer target: restore validation. An input picks a source geometry, a
// target geometry and a boundary length; the source is a real CPU session
// primed to that boundary and captured in full; the rest of the input is a
// list of mutations of that snapshot (any field set to any value, planes
// resized, bits flipped, layers swapped, dropped, duplicated or replaced).
// The mutated snapshot is offered to a fresh session of the target geometry:
//  - refused: the cache is left exactly as it was (every arena byte, fresh);
//  - restored: every invariant holds, a full capture gives back the offered
//    snapshot, and the session takes further tokens.
// Input layout: [source][target][len][call seed] then 6-byte records
// [op][layer][value u32 little-endian].
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

struct World {
  std::shared_ptr<Device> dev = NewCpuDevice({.memory_bytes = 256ull << 20});
  std::vector<Geometry> geometries = Geometries();
  std::vector<std::unique_ptr<Engine>> engines;
  World() {
    for (const Geometry& g : geometries) {
      auto e = Engine::Create(dev, ReserveRequest{g.plan, g.max_ctx, 2, 0, g.ring});
      PC_FUZZ_CHECK(e.ok());
      engines.push_back(std::move(e).value());
    }
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

std::vector<std::byte> Bytes(Device& d, const Memory& m) {
  std::vector<std::byte> v(m.bytes());
  PC_FUZZ_CHECK(d.Download(v.data(), m.data(), m.bytes(), Lane::kCompute).ok());
  return v;
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
    return xs.len == ys.len && xs.width == ys.width && xs.index_width == ys.index_width && xs.pool == ys.pool &&
           xs.pools_ready == ys.pools_ready && eq(x->latent_rows, y.latent_rows) &&
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

  // The source: a real session primed to the boundary in a few calls.
  std::vector<LayerSnapshot> snap;
  {
    auto src = world->engines[src_i]->NewSession();
    PC_FUZZ_CHECK(src.ok());
    Rng rng{0x9e3779b97f4a7c15ull ^ data[3]};
    for (std::uint64_t done = 0; done < len;) {
      const std::uint64_t t = std::min<std::uint64_t>(len - done, 1 + (data[3] + done) % 37);
      PC_FUZZ_CHECK(Feed(dev, *src.value(), rng, t).ok());
      done += t;
    }
    auto full = src.value()->CaptureFull();
    PC_FUZZ_CHECK(full.ok());
    snap = std::move(full).value();
  }
  for (std::size_t at = 4; at + 6 <= size; at += 6) {
    std::uint32_t v;
    std::memcpy(&v, data + at + 2, 4);
    Mutate(snap, data[at], data[at + 1], v);
  }

  auto opened = world->engines[dst_i]->NewSession();
  PC_FUZZ_CHECK(opened.ok());
  SessionCache& dst = *opened.value();
  const Memory& arena = EngineInternals::Arena(dst);
  const std::vector<std::byte> before = Bytes(dev, arena);
  const Status validated = dst.ValidateRestore(snap);
  const Status restored = dst.Restore(snap);
  PC_FUZZ_CHECK(validated.ok() == restored.ok());
  if (!restored.ok()) {
    PC_FUZZ_CHECK(!restored.message().empty());
    PC_FUZZ_CHECK(dst.fresh());
    PC_FUZZ_CHECK(Bytes(dev, arena) == before);
    return 0;
  }
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
