// Group publishes (PublishGroup, primecache/internal/store.h): what one
// publisher has staged (StagedPart), and the table of groups in progress.
//
// A part's publisher stages its chunks as any publisher does. Its Commit
// makes them durable, then parks its StagedPart in the group; the part that
// completes the group takes every parked part (rank order) and writes the
// entry in one batch (LocalStore::Impl::CommitParts). A part that ends
// uncommitted, or a group not complete by its deadline, aborts the group:
// every parked part's bytes are cut from their segments and given back.
// An aborted group stays in the table, refusing late parts, until its
// deadline; a crash leaves only segment tails past their committed length,
// which the next open cuts.
//
// Thread-safety: GroupTable is internally locked (mu_, a leaf lock: parts
// are taken out under it, then committed or aborted with it released).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "primecache/internal/manifest.h"
#include "primecache/internal/store.h"
#include "statestore/segments.h"
#include "statestore/store_impl.h"

namespace primecache::statestore_internal {

// One chunk a publisher was given: its size, how often its layers name it,
// where this publisher wrote it (if it did) and where a committed copy was
// when it arrived (if there was one).
struct StagedChunk {
  std::uint64_t size = 0;
  std::uint64_t count = 0;
  std::optional<Extent> wrote;
  std::optional<Extent> seen;
};

// What one publisher has staged. Move-only (it owns its segment writer).
struct StagedPart {
  std::vector<ManifestLayer> layers;
  std::unordered_map<Hash128, StagedChunk, Hash128Hasher> chunks;
  std::unique_ptr<SegmentWriter> writer;  // taken at the first chunk written
  std::uint64_t chunk_bytes = 0;
  std::uint64_t raw_bytes = 0;
  std::uint64_t written_bytes = 0;
  std::uint64_t reserved = 0;    // counted against max_staged_bytes
  bool batch_attempted = false;  // a commit began writing the metadata batch
};

class GroupTable {
 public:
  struct Group;

  // `abort_part` gives one part's bytes back (LocalStore::Impl::AbortPart).
  GroupTable(std::chrono::milliseconds timeout, std::function<void(StagedPart&)> abort_part);
  ~GroupTable();  // Close()
  GroupTable(const GroupTable&) = delete;
  GroupTable& operator=(const GroupTable&) = delete;

  // Aborts every group and stops the reaper (the store is closing).
  void Close() EXCLUDES(mu_);

  // Part `g.rank` of the group of this identity and token begins. The first
  // part makes the group (*first = true). Refuses a rank that began already,
  // another rank count than the group's, and an aborted group (its reason).
  Result<std::shared_ptr<Group>> Join(const PublishRequest& req, bool* first) EXCLUDES(mu_);
  // The part ended without a commit: the group aborts with `why`.
  void Abandon(const std::shared_ptr<Group>& group, const Status& why) EXCLUDES(mu_);
  // A committed part, its bytes durable. nullopt: parked, waiting for the
  // others. Otherwise this part completed the group: every part in rank
  // order, taken out of the group, for the caller to commit (and then
  // Finish) or abort. Aborted (the part given back) when the group aborted.
  Result<std::optional<std::vector<StagedPart>>> Park(const std::shared_ptr<Group>& group, std::uint32_t rank,
                                                      StagedPart part) EXCLUDES(mu_);
  // The group's entry was written or refused: it leaves the table.
  void Finish(const std::shared_ptr<Group>& group) EXCLUDES(mu_);

  std::size_t open_groups() const EXCLUDES(mu_);  // not finished, not aborted
  std::uint64_t aborted_groups() const { return aborted_.load(); }

 private:
  static std::string KeyOf(const PublishRequest& req);
  // Marks the group aborted and takes its parked parts out (to give back
  // with mu_ released).
  std::vector<StagedPart> AbortLocked(Group& g, const Status& why) REQUIRES(mu_);
  void GiveBack(std::vector<StagedPart> parts);
  void ReapLoop() EXCLUDES(mu_);

  const std::chrono::milliseconds timeout_;
  const std::function<void(StagedPart&)> abort_part_;
  mutable Mutex mu_;
  CondVar cv_;
  std::map<std::string, std::shared_ptr<Group>> groups_ GUARDED_BY(mu_);
  bool closing_ GUARDED_BY(mu_) = false;
  std::atomic<std::uint64_t> aborted_{0};
  std::thread reaper_;
};

}  // namespace primecache::statestore_internal
