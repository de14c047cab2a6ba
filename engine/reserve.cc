#include "primecache/internal/reserve.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace primecache::engine {
namespace {

constexpr std::uint64_t kF32 = sizeof(float);
constexpr std::uint64_t kMaxCtx = static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max());

// Lays buffers out one after the other, each aligned, and remembers whether
// any size or offset overflowed.
class Layout {
 public:
  std::uint64_t Mul(std::uint64_t a, std::uint64_t b) {
    std::uint64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) overflow_ = true;
    return r;
  }
  std::uint64_t Mul(std::uint64_t a, std::uint64_t b, std::uint64_t c) { return Mul(Mul(a, b), c); }
  BufferSpan Take(std::uint64_t bytes) {
    if (bytes == 0) return {end_, 0};
    BufferSpan s{end_, bytes};
    std::uint64_t next = 0;
    if (__builtin_add_overflow(end_, bytes, &next) ||
        __builtin_add_overflow(next, kReserveAlignment - 1, &next)) {
      overflow_ = true;
      return s;
    }
    end_ = next / kReserveAlignment * kReserveAlignment;
    return s;
  }
  std::uint64_t RoundUp(std::uint64_t v, std::uint64_t to) {
    std::uint64_t r = 0;
    if (__builtin_add_overflow(v, to - 1, &r)) overflow_ = true;
    return r / to * to;
  }
  std::uint64_t end() const { return end_; }
  bool overflow() const { return overflow_; }

 private:
  std::uint64_t end_ = 0;
  bool overflow_ = false;
};

std::string Bytes(std::uint64_t b) {
  char buf[64];
  const double v = static_cast<double>(b);
  if (b >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", v / (1ull << 30));
  } else if (b >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", v / (1ull << 20));
  } else if (b >= (1ull << 10)) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", v / (1ull << 10));
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  }
  return buf;
}

// The reserve's largest named terms (summed over sessions), largest first.
std::vector<std::pair<std::string, std::uint64_t>> Terms(const ReservePlan& p) {
  std::vector<std::pair<std::string, std::uint64_t>> t;
  const std::uint64_t s = p.request.sessions;
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    const std::string l = "layer " + std::to_string(i) + " ";
    std::visit(
        [&](const auto& r) {
          using T = std::decay_t<decltype(r)>;
          if constexpr (std::is_same_v<T, LatentReserve>) {
            t.emplace_back(l + "latent rows", r.rows.bytes * s);
            t.emplace_back(l + (r.index_is_ring ? "index ring" : "flat index plane"),
                           r.index_plane.bytes * s);
            t.emplace_back(l + "pool keys", r.pool_keys.bytes * s);
          } else if constexpr (std::is_same_v<T, RecurrentReserve>) {
            t.emplace_back(l + "recurrent state pair", (r.state[0].bytes + r.state[1].bytes) * s);
            t.emplace_back(l + "round stash", r.round.bytes() * s);
          } else {
            t.emplace_back(l + (r.rows < p.request.max_ctx ? "rotating K/V rows" : "K/V rows"),
                           (r.k_rows.bytes + r.v_rows.bytes) * s);
            t.emplace_back(l + "round stash", (r.round_k.bytes + r.round_v.bytes) * s);
          }
        },
        p.layers[i]);
  }
  t.emplace_back("snapshot slots", p.slot_bytes * p.request.snapshot_slots);
  std::stable_sort(t.begin(), t.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return t;
}

// A recurrent layer's round stash for rounds of `t` positions (empty when t is 0).
RecurrentRoundStash TakeRoundStash(Layout& arena, const RecurrentShape& l, std::uint64_t t) {
  RecurrentRoundStash r;
  if (t == 0) return r;
  const std::uint64_t nd = std::uint64_t{l.heads} * l.head_dim;
  r.conv_ring = arena.Take(arena.Mul(l.conv_values(), kF32));
  r.state = arena.Take(arena.Mul(l.state_values(), kF32));
  r.raw = arena.Take(arena.Mul(t, l.conv_channels(), kF32));
  r.qkv = arena.Take(arena.Mul(t, l.conv_channels(), kF32));
  r.g = arena.Take(arena.Mul(t, nd, kF32));
  r.b = arena.Take(arena.Mul(t, l.heads, kF32));
  r.out = arena.Take(arena.Mul(t, nd, kF32));
  return r;
}

void AddProblem(std::string* problems, std::size_t layer, const std::string& what) {
  *problems += (problems->empty() ? "" : "; ") + std::string("layer ") + std::to_string(layer) + ": " + what;
}

// Lays a plan's layers out, in layer order, in one session arena and one
// snapshot slot, appending each layer's reserve and slot area to the plan and
// collecting what the request cannot give a layer. The order of the Takes is
// the layout: the engine carves its arenas at these offsets.
class LayerPlanner {
 public:
  LayerPlanner(const ReserveRequest& req, ReservePlan* plan) : req_(req), p_(*plan) {}

  void Add(std::size_t i, const LatentPlan& l) {
    LatentReserve r;
    r.rows = arena_.Take(arena_.Mul(req_.max_ctx, l.width(), kF32));
    r.len_mirror = arena_.Take(sizeof(std::int32_t));
    SlotArea area;
    if (l.has_indexer()) {
      CheckIndexRing(i, l);
      r.index_is_ring = req_.index_ring_rows != 0;
      r.index_rows = r.index_is_ring ? req_.index_ring_rows : req_.max_ctx;
      r.index_plane = arena_.Take(arena_.Mul(r.index_rows, l.index_width(), kF32));
      r.pool_key_capacity = req_.max_ctx / l.pool;
      r.pool_keys = arena_.Take(arena_.Mul(r.pool_key_capacity, l.index_head_dim, kF32));
      const std::uint64_t tail_bytes = arena_.Mul(l.pool - 1, l.index_width(), kF32);
      r.tail_scratch = arena_.Take(tail_bytes);
      area.tail = slot_.Take(tail_bytes);
    }
    p_.layers.emplace_back(r);
    p_.slot_areas.push_back(area);
  }

  void Add(std::size_t /*i*/, const RecurrentShape& l) {
    RecurrentReserve r;
    const std::uint64_t conv = arena_.Mul(l.conv_values(), kF32);
    const std::uint64_t state = arena_.Mul(l.state_values(), kF32);
    r.conv_ring = arena_.Take(conv);
    r.state[0] = arena_.Take(state);
    r.state[1] = arena_.Take(state);
    r.round = TakeRoundStash(arena_, l, req_.round_tokens);
    SlotArea area;
    area.conv_ring = slot_.Take(conv);
    area.state = slot_.Take(state);
    p_.layers.emplace_back(r);
    p_.slot_areas.push_back(area);
  }

  void Add(std::size_t i, const KvPlan& l) {
    KvReserve r;
    r.rows = l.capacity(req_.max_ctx);
    const std::uint64_t k_bytes = arena_.Mul(r.rows, l.k_width, kF32);
    const std::uint64_t v_bytes = arena_.Mul(r.rows, l.v_width, kF32);
    r.k_rows = arena_.Take(k_bytes);
    r.v_rows = arena_.Take(v_bytes);
    r.len_mirror = arena_.Take(sizeof(std::int32_t));
    if (l.format.rotating() && req_.round_tokens != 0) {
      if (req_.round_tokens > r.rows) {
        AddProblem(&problems_, i,
                   "a round of " + std::to_string(req_.round_tokens) +
                       " tokens passes the rotating buffer of " + std::to_string(r.rows) + " rows");
      }
      r.round_k = arena_.Take(arena_.Mul(req_.round_tokens, l.k_width, kF32));
      r.round_v = arena_.Take(arena_.Mul(req_.round_tokens, l.v_width, kF32));
    }
    SlotArea area;
    if (l.format.rotating()) {
      area.k_rows = slot_.Take(k_bytes);
      area.v_rows = slot_.Take(v_bytes);
    }
    p_.layers.emplace_back(r);
    p_.slot_areas.push_back(area);
  }

  const std::string& problems() const { return problems_; }

  // The totals: arena and slot sizes rounded to the allocation granule, and
  // what every session and slot takes together; InvalidArgument when any
  // size overflowed 64 bits.
  Result<ReservePlan> Finish() {
    Layout total;
    p_.session_bytes = total.RoundUp(arena_.end(), kAllocationGranule);
    p_.slot_bytes = total.RoundUp(slot_.end(), kAllocationGranule);
    const std::uint64_t sessions_bytes = total.Mul(p_.session_bytes, req_.sessions);
    const std::uint64_t slots_bytes = total.Mul(p_.slot_bytes, req_.snapshot_slots);
    p_.pinned_bytes = slots_bytes;
    if (__builtin_add_overflow(sessions_bytes, slots_bytes, &p_.device_bytes) || arena_.overflow() ||
        slot_.overflow() || total.overflow()) {
      return Status::InvalidArgument(
          "reserve: sizes overflow 64 bits (max_ctx " + std::to_string(req_.max_ctx) + ", sessions " +
          std::to_string(req_.sessions) + ", slots " + std::to_string(req_.snapshot_slots) + ")");
    }
    return std::move(p_);
  }

 private:
  // A ring index plane must hold a pool, and a round after a partial pool.
  void CheckIndexRing(std::size_t i, const LatentPlan& l) {
    const std::uint64_t ring = req_.index_ring_rows;
    if (ring != 0 && ring < l.pool) {
      AddProblem(&problems_, i,
                 "a ring of " + std::to_string(ring) + " rows holds less than one pool of " +
                     std::to_string(l.pool));
    } else if (ring != 0 && ring < MinRingRows(l.pool, req_.round_tokens)) {
      AddProblem(&problems_, i,
                 "a ring of " + std::to_string(ring) + " rows cannot hold a round of " +
                     std::to_string(req_.round_tokens) + " tokens after a partial pool of " +
                     std::to_string(l.pool) + " (it needs " +
                     std::to_string(MinRingRows(l.pool, req_.round_tokens)) + ")");
    }
  }

  const ReserveRequest& req_;
  ReservePlan& p_;
  Layout arena_, slot_;
  std::string problems_;
};

}  // namespace

std::uint64_t MinRingRows(std::uint32_t pool, std::uint32_t round_tokens) {
  if (pool == 0) return 0;
  if (round_tokens == 0) return pool;
  const std::uint64_t need = std::uint64_t{pool} - 1 + round_tokens;
  return (need + pool - 1) / pool * pool;
}

std::uint64_t BytesPerToken(const LayerPlan& layer, std::uint64_t len) {
  if (const auto* l = std::get_if<LatentPlan>(&layer)) return std::uint64_t{l->width()} * kF32;
  if (std::holds_alternative<RecurrentShape>(layer)) return 0;
  const auto& kv = std::get<KvPlan>(layer);
  if (kv.format.rotating() && len >= kv.format.window) return 0;
  return (std::uint64_t{kv.k_width} + kv.v_width) * kF32;
}

std::string ReservePlan::Summary() const {
  return std::to_string(request.sessions) + " sessions x " + Bytes(session_bytes) + " + " +
         std::to_string(request.snapshot_slots) + " slots x " + Bytes(slot_bytes) + " = " +
         Bytes(device_bytes) + " device, " + Bytes(pinned_bytes) + " pinned";
}

Result<ReservePlan> PlanReserve(const ReserveRequest& req) {
  PC_RETURN_IF_ERROR(CheckPlan(req.plan));
  if (req.max_ctx == 0 || req.max_ctx > kMaxCtx) {
    return Status::InvalidArgument("reserve: max_ctx " + std::to_string(req.max_ctx) + " outside [1, " +
                                   std::to_string(kMaxCtx) + "]");
  }
  if (req.sessions == 0) return Status::InvalidArgument("reserve: sessions must be >= 1");

  ReservePlan p;
  p.request = req;
  LayerPlanner planner(req, &p);
  for (std::size_t i = 0; i < req.plan.layers.size(); ++i) {
    std::visit([&](const auto& l) { planner.Add(i, l); }, req.plan.layers[i]);
  }
  if (!planner.problems().empty()) return Status::InvalidArgument("reserve: " + planner.problems());
  return planner.Finish();
}

Result<ReservePlan> Preflight(const ReserveRequest& request, std::uint64_t free_bytes) {
  PC_ASSIGN_OR_RETURN(ReservePlan p, PlanReserve(request));
  if (p.device_bytes <= free_bytes) return p;
  std::string msg = "reserve of " + Bytes(p.device_bytes) + " (" + p.Summary() +
                    ") exceeds free device memory " + Bytes(free_bytes) + " by " +
                    Bytes(p.device_bytes - free_bytes) + "; largest terms:";
  const auto terms = Terms(p);
  for (std::size_t i = 0; i < terms.size() && i < 3; ++i) {
    msg += (i ? ", " : " ") + terms[i].first + " " + Bytes(terms[i].second);
  }
  return Status::ResourceExhausted(msg);
}

std::vector<std::uint64_t> RingFitLadder(const ReserveRequest& request) {
  std::vector<std::uint64_t> ladder{request.index_ring_rows};
  std::uint64_t floor = 0;
  for (const auto& l : request.plan.layers) {
    if (const auto* lp = std::get_if<LatentPlan>(&l); lp != nullptr && lp->has_indexer()) {
      floor = std::max<std::uint64_t>(floor, MinRingRows(lp->pool, request.round_tokens));
    }
  }
  if (floor == 0) return ladder;
  const std::uint64_t start = request.index_ring_rows == 0 ? request.max_ctx : request.index_ring_rows;
  for (std::uint64_t d = start / 2; d >= floor; d /= 2) ladder.push_back(d);
  return ladder;
}

Result<FitResult> FitReserve(const ReserveRequest& wanted, std::uint64_t free_bytes, FitTarget target) {
  if (target == FitTarget::kRingRows) {
    Status last;
    for (std::uint64_t depth : RingFitLadder(wanted)) {
      ReserveRequest r = wanted;
      r.index_ring_rows = depth;
      Result<ReservePlan> p = Preflight(r, free_bytes);
      if (p.ok()) return FitResult{std::move(r), std::move(p).value()};
      if (!p.status().IsResourceExhausted()) return p.status();
      last = p.status();
    }
    return last.WithContext("no index ring depth fits");
  }
  ReserveRequest base = wanted;
  base.snapshot_slots = 0;
  PC_ASSIGN_OR_RETURN(ReservePlan p0, Preflight(base, free_bytes));
  std::uint64_t n = wanted.snapshot_slots;
  if (p0.slot_bytes != 0) n = std::min<std::uint64_t>(n, (free_bytes - p0.device_bytes) / p0.slot_bytes);
  ReserveRequest r = wanted;
  r.snapshot_slots = static_cast<std::uint32_t>(n);
  PC_ASSIGN_OR_RETURN(ReservePlan p, Preflight(r, free_bytes));
  return FitResult{std::move(r), std::move(p)};
}

}  // namespace primecache::engine
