// Engine-internal state shared by an Engine, its sessions and their pending
// captures, so that none of them depends on the others' lifetimes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/device.h"
#include "engine/layer_state.h"
#include "engine/session_state.h"
#include "primecache/internal/engine.h"
#include "primecache/internal/reserve.h"

namespace primecache::engine {

// Low-water marks of one eager capture: per cache layer, the lowest len any
// rewind reached since the capture (UINT64_MAX: none). Layers that can rewind
// (latent, KV) hold weak references and lower the marks in Truncate.
struct RewindWatch {
  std::vector<std::uint64_t> low;
};

// Logical rows [first, first + count) of a ring of `ring` rows (count <=
// ring) as at most two runs of physical rows: run k covers logical offsets
// [offset, offset + rows) at physical rows [physical, physical + rows).
struct RingRun {
  std::uint64_t physical = 0, offset = 0, rows = 0;
};
inline std::vector<RingRun> RingRuns(std::uint64_t first, std::uint64_t count, std::uint64_t ring) {
  std::vector<RingRun> runs;
  if (count == 0) return runs;
  const std::uint64_t start = first % ring, head = std::min(count, ring - start);
  runs.push_back({start, 0, head});
  if (head < count) runs.push_back({0, head, count - head});
  return runs;
}

struct EngineCore {
  // Declared first so that it is destroyed last: every Memory below frees
  // through it.
  std::shared_ptr<Device> device;
  ReservePlan plan;

  std::mutex mu;  // guards the in-use flags and the id counter
  std::vector<Memory> arenas;
  std::vector<bool> arena_in_use;
  // Whether a free arena reads all zeros already (zeroed when its last
  // session was handed back), so the next session need not zero it first.
  std::vector<bool> arena_zeroed;
  std::vector<Memory> slots;         // device, slot_bytes each
  std::vector<Memory> slot_staging;  // pinned twins
  std::vector<bool> slot_in_use;
  std::uint64_t next_session_id = 1;

  // A free slot, marked in use; ResourceExhausted when none is free.
  Result<std::uint32_t> AcquireSlot();
  void ReleaseSlot(std::uint32_t slot);
};

// Engine-internal access past the public API, for the engine's tests and
// fuzz targets: they compare a session's arena bytes before and after a
// refused restore, and break a session or a layer on purpose to see the
// break refused. This header is not installed, so the access is not public.
struct EngineInternals {
  // Every SessionCache is a SessionState.
  static const Memory& Arena(const SessionCache& s) {
    const auto& state = static_cast<const SessionState&>(s);
    return state.core_->arenas[state.arena_];
  }
  static Device& DeviceOf(const SessionCache& s) { return *static_cast<const SessionState&>(s).core_->device; }
  static void Break(SessionCache& s, std::string why) { static_cast<SessionState&>(s).broken_ = std::move(why); }
  static void SetPoolsReady(LatentCacheLayer& l, std::uint64_t v) {
    static_cast<LatentLayerState&>(l).pools_ready_ = v;  // every LatentCacheLayer is one
  }
};

}  // namespace primecache::engine
