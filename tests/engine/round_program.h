// A round program: a byte string read as a sequence of speculative-round
// operations on a CPU session (the fuzz target round_fuzzer.cc, and its
// deterministic replay in engine_test). Session A runs the program; session B
// is only ever given what A keeps (every append of a resolved round's kept
// prefix, in one call). The invariants checked after every operation:
//  - a refused operation leaves A as it was;
//  - A's full capture equals B's bit for bit, inside a round too (a capture
//    there takes the committed state);
//  - an eager capture taken at any point completes later, through any
//    rounds, into the state B held when it was taken.
// Input: [geometry][seed] then 2-byte records [op][arg] (the first kProgramSteps).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tests/engine/round_feeder.h"

namespace primecache::engine::testing {

struct RoundGeometry {
  StatePlan plan;
  std::uint64_t ring = 0;
};

inline std::vector<RoundGeometry> RoundGeometries() {
  const KvPlan rot{4, 4, KvFormat{6, 0, 0, 0}}, tq{6, 6, KvFormat{5, 4, 16, 3}}, plain{3, 5, {}};
  return {
      {StatePlan{{RecurrentShape{2, 4, 4}, LatentPlan{8, 4, 4, 4}, rot, LatentPlan{6, 0, 0, 0}, plain}}, 8},
      {StatePlan{{LatentPlan{8, 0, 4, 3}, RecurrentShape{1, 4, 2}, tq}}, 9},
      {StatePlan{{RecurrentShape{1, 8, 3}, rot}}, 0},
      {StatePlan{{LatentPlan{8, 4, 4, 2}, plain, tq}}, 0},
  };
}

inline constexpr std::uint32_t kProgramRound = 5;
inline constexpr std::uint64_t kProgramCtx = 160;
inline constexpr std::size_t kProgramSteps = 200;  // records read; the rest of an input is ignored

// A program's violations; empty when every invariant held.
class RoundProgram {
 public:
  std::vector<std::string> Run(const std::uint8_t* data, std::size_t size) {
    if (size < 2) return {};
    const auto geos = RoundGeometries();
    const RoundGeometry& g = geos[data[0] % geos.size()];
    dev_ = NewCpuDevice({.memory_bytes = 1ull << 30});
    ReserveRequest req{g.plan, kProgramCtx, 2, 2, g.ring};
    req.round_tokens = kProgramRound;
    auto e = Engine::Create(dev_, req);
    if (!e.ok()) return {"engine: " + e.status().ToString()};
    engine_ = std::move(e).value();
    a_ = engine_->NewSession().value();
    b_ = engine_->NewSession().value();
    fa_ = std::make_unique<RoundFeeder>(dev_.get(), a_.get(), data[1]);
    fb_ = std::make_unique<RoundFeeder>(dev_.get(), b_.get(), data[1]);
    // Longer programs add no new states, only time (every step captures twice).
    const std::size_t end = std::min<std::size_t>(size, 2 + 2 * kProgramSteps);
    for (std::size_t i = 2; i + 1 < end && errors_.empty(); i += 2) Step(data[i], data[i + 1]);
    return errors_;
  }

 private:
  void Fail(const std::string& what) { errors_.push_back(what); }
  void Expect(const Status& st, const char* what) {
    if (!st.ok()) Fail(std::string(what) + ": " + st.ToString());
  }

  void Step(std::uint8_t op, std::uint8_t arg) {
    switch (op % 6) {
      case 0:
        return Append(1 + arg % 7);
      case 1:
        return Arm(1 + arg % (kProgramRound + 1));  // kProgramRound + 1 is refused
      case 2:
        return Resolve(round_ ? appended_ : 0, /*commit=*/true);
      case 3:
        return Resolve(arg % (appended_ + 2), /*commit=*/false);  // appended + 1 is refused
      case 4:
        return TakeEager();
      default:
        return CompleteEager();
    }
  }

  void Append(std::uint64_t n) {
    if (fa_->position() + n > kProgramCtx) return;
    const bool fits = !round_ || appended_ + n <= limit_;
    Status st = fa_->Append(n);
    if (st.ok() != fits) return Fail("append of " + std::to_string(n) + ": " + st.ToString());
    if (!st.ok()) return Compare("after a refused append");
    if (round_) {
      appended_ += n;
    } else {
      Expect(fb_->Append(n), "reference append");
    }
    Compare("after an append");
  }

  void Arm(std::uint64_t n) {
    Status st = fa_->Arm(n);
    const bool ok = !round_ && n <= kProgramRound;
    if (st.ok() != ok) return Fail("arm " + std::to_string(n) + ": " + st.ToString());
    if (st.ok()) {
      round_ = true;
      limit_ = n;
      appended_ = 0;
    }
    Compare("after arming");
  }

  void Resolve(std::uint64_t keep, bool commit) {
    Status st = commit ? fa_->Commit() : fa_->Rollback(keep);
    const bool ok = round_ && keep <= appended_;
    if (st.ok() != ok)
      return Fail((commit ? "commit: " : "rollback to " + std::to_string(keep) + ": ") + st.ToString());
    if (!st.ok()) return Compare("after a refused resolution");
    round_ = false;
    if (keep != 0) Expect(fb_->Append(keep), "reference append of the kept tokens");
    Compare(commit ? "after a commit" : "after a rollback");
  }

  void TakeEager() {
    if (pending_ || !Capturable()) return;
    auto pc = a_->CaptureEager();
    if (!pc.ok()) return Fail("eager capture: " + pc.status().ToString());
    auto half = pc->Collect();
    if (!half.ok()) return Fail("collect: " + half.status().ToString());
    pending_.emplace(std::move(half).value(), b_->CaptureFull().value());
  }

  void CompleteEager() {
    if (!pending_) return;
    auto done = a_->CompleteCapture(pending_->first);
    if (!done.ok()) return Fail("deferred half: " + done.status().ToString());
    if (!Same(*done, pending_->second)) Fail("the completed capture is not the state at its boundary");
    pending_.reset();
  }

  bool Capturable() const { return fb_->position() > 0; }

  void Compare(const char* when) {
    if (!Capturable()) return;
    auto x = a_->CaptureFull(), y = b_->CaptureFull();
    if (!x.ok() || !y.ok()) return Fail(std::string(when) + ": capture failed");
    if (!Same(*x, *y)) Fail(std::string(when) + ": the session differs from the reference");
  }

  static bool Same(const std::vector<LayerSnapshot>& x, const std::vector<LayerSnapshot>& y) {
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i) {
      auto bytes = [](const LayerSnapshot& s) {
        std::vector<float> v;
        std::visit(
            [&](const auto& l) {
              using T = std::decay_t<decltype(l)>;
              if constexpr (std::is_same_v<T, LatentSnapshot>) {
                v.push_back(static_cast<float>(l.shape.len));
                v.push_back(static_cast<float>(l.shape.pools_ready));
                for (const auto* p : {&l.latent_rows, &l.index_tail_rows, &l.pool_keys})
                  v.insert(v.end(), p->begin(), p->end());
              } else if constexpr (std::is_same_v<T, RecurrentSnapshot>) {
                for (const auto* p : {&l.conv_ring, &l.state}) v.insert(v.end(), p->begin(), p->end());
              } else {
                v.push_back(static_cast<float>(l.shape.len));
                v.push_back(static_cast<float>(l.shape.rows));
                for (const auto* p : {&l.k_rows, &l.v_rows}) v.insert(v.end(), p->begin(), p->end());
              }
            },
            s);
        return v;
      };
      const auto a = bytes(x[i]), b = bytes(y[i]);
      if (a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0)
        return false;
    }
    return true;
  }

  std::shared_ptr<Device> dev_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<SessionCache> a_, b_;
  std::unique_ptr<RoundFeeder> fa_, fb_;
  bool round_ = false;
  std::uint64_t limit_ = 0, appended_ = 0;
  std::optional<std::pair<EagerHalf, std::vector<LayerSnapshot>>> pending_;
  std::vector<std::string> errors_;
};

}  // namespace primecache::engine::testing
