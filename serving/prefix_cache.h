// PrefixCache: a HybridModel served through the store. For each request it
// looks the longest stored prefix up in the daemon and fetches it into
// staging as the chunks land: with device staging (the CUDA default) a raw
// chunk is checked and copied host-to-device straight from the client's
// shared region (registered with the device once), or device to device from
// the device window when the daemon copied it there from the page cache (a
// daemon with device copies; the window is exported to it at start), and an
// encoded one is decoded on a pool into pinned staging and copied up; with host staging
// (the CPU default) every chunk is decoded into pinned staging. Only when
// every layer is there and ValidateRestore passed on the whole set do bytes
// move into the fresh cache (device to device, or host to device); then it
// primes only the rest. At the prompt's end it takes the eager half of the
// boundary capture; after generation Finish completes the deferred half into
// a pinned arena and hands it to a background thread that encodes each chunk
// from there and publishes it, so decoding never waits on the daemon.
//
// With no daemon (or when it goes away) every request falls back to a full
// prefill; the first such fallback is logged, later ones are not.
//
// Thread-safety: one thread drives requests; publishing runs on the
// PrefixCache's own worker thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/worker_pool.h"
#include "engine/model/hybrid_model.h"
#include "primecache/client.h"
#include "primecache/internal/codec.h"
#include "primecache/internal/snapshot.h"

namespace primecache::model {

class StagedFetch;

struct PrefixCacheOptions {
  EncodeOptions encode;         // how published layers are encoded
  bool publish = true;          // publish boundaries at all (each kind below also has its own switch)
  // Which boundaries a request publishes. A hybrid model's recurrent state
  // cannot be cut back to a shorter prefix, so a later request restores
  // only a prefix where a boundary was captured:
  //  - the prompt's end;
  //  - the branch point: where the lookup says the prompt stops sharing
  //    tokens with a stored entry, when that lies beyond the restored prefix
  //    (a shared system prompt or few-shot block becomes a boundary of its
  //    own; the prefill stops there for the eager half of a capture);
  //  - the generation's end: the prompt and the generated tokens fed so far,
  //    at Finish (a conversation's next turn restores its own last reply);
  //  - checkpoints: every checkpoint_every prompt tokens (0: none), so that a
  //    long document asked again with an edited tail restores most of it.
  bool publish_prompt_end = true;
  bool publish_branch_points = true;
  bool publish_generation_end = true;
  std::uint64_t checkpoint_every = 0;
  std::size_t min_prefix = 1;   // shortest stored prefix worth restoring
  // Threads that decode fetched chunks into pinned staging while the next
  // ones arrive; 0: the hardware's threads, at most 8.
  std::size_t decode_threads = 0;
  // Threads that encode a published layer's chunks; 0: half the decode threads.
  std::size_t encode_threads = 0;
  // Where a fetched entry is staged before the restore: kAuto is kDevice on
  // a CUDA device, kHost on the CPU backend (where kDevice runs the same
  // steps through the CPU twin).
  enum class Staging : std::uint8_t { kAuto, kDevice, kHost };
  Staging staging = Staging::kAuto;
  // With device staging, device memory exported to a daemon that makes
  // device copies (ServerInfo::device_copies): it copies raw chunks from the
  // page cache straight into it, and they are copied on to device staging
  // from there. 0: no window (every chunk comes through the shared region).
  std::uint64_t device_window_bytes = 256ull << 20;
  // This engine as one rank of a tensor-parallel engine whose ranks each run
  // a PrefixCache of their own (in processes or threads of their own), over
  // the rank's model (RankConfig, RankWeights, its HybridModelOptions'
  // collective) under the whole model's ModelIdFor (docs/model.md, "Ranks
  // of their own"):
  //  - a restore: rank 0 looks up, and its hit reaches every rank through
  //    the model's collective (BroadcastWords); each rank fetches only the
  //    entry layers that hold its heads (PlanRankParts): of an entry of this
  //    TP size straight into its staging, of another decoded and resharded
  //    on the host (FetchRankParts); every rank validates, and the ranks
  //    restore only when every one passed (AllRanksOk), else all prime in
  //    full. A model without a collective looks up on each rank by itself;
  //  - a publish: each rank's head-group parts of a group (PublishGroup,
  //    serving/head_groups.h), part 0 every replicated layer and each part
  //    one run of the sharded layers' heads, under group_token.
  // size 1 is an engine of its own; it still restores entries of TP
  // engines (resharded on the host).
  struct TpRank {
    std::uint32_t size = 1;
    std::uint32_t rank = 0;
    // One per engine, shared by its ranks and by no other engine; not 0
    // when size > 1 and the engine publishes.
    std::uint64_t group_token = 0;
  };
  TpRank tp;
};

// One request in flight: its session, what it cost, and the eager half of
// its boundary capture (when one could be taken).
struct Request {
  ModelSession session;
  std::vector<std::uint32_t> prompt;
  std::vector<float> last_logits;   // the prompt's last position
  std::vector<float> all_logits;    // every primed position, when asked for
  std::uint64_t restored_tokens = 0;
  std::uint64_t prefilled_tokens = 0;
  double ttft_ms = 0;
  double restore_ms = 0;             // lookup, fetch, decode, validation and restore
  // Its parts: the lookup round trip; fetching and decoding into pinned
  // staging (they overlap); validating and copying to the device.
  double lookup_ms = 0, fetch_ms = 0, copy_ms = 0;
  std::uint64_t restored_bytes = 0;  // decoded bytes of the restored planes
  // The lookup's branch point: how far the prompt shares tokens with a
  // stored entry (0 without a lookup, or when branch points are off).
  std::uint64_t shared_tokens = 0;
  std::uint64_t direct_chunks = 0;   // raw chunks copied to the device straight from the region
  // Raw chunks the daemon copied into the device window, and their bytes.
  std::uint64_t device_chunks = 0, device_chunk_bytes = 0;
  std::optional<engine::PendingCapture> capture;  // the prompt end's eager half
  // Eager halves taken inside the prefill (branch point, checkpoints), with
  // their boundary lengths; Finish completes and publishes them.
  std::vector<std::pair<std::uint64_t, engine::EagerHalf>> prefill_captures;
};

class PrefixCache {
 public:
  // `client` may be null: the model then runs without the store.
  PrefixCache(HybridModel* model, std::unique_ptr<client::Client> client, client::ModelId model_id,
              PrefixCacheOptions options = {});
  ~PrefixCache();  // waits for queued publishes
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The identity entries of this model are stored under: the fingerprint of
  // architecture, state-plan geometry (widths, not capacities), weights and
  // codec versions.
  static client::ModelId ModelIdFor(const ModelConfig& config, const Weights& weights);

  // Runs a prompt in a fresh session. all_logits: also keep every position's
  // logits (restored positions have none).
  Result<Request> Prime(std::span<const std::uint32_t> prompt, bool all_logits = false);

  // After generation: completes the deferred captures and queues their
  // publishes: the prompt end and those taken inside the prefill, and, with
  // publish_generation_end, the boundary of the prompt and `generated` as
  // far as the session has fed them (its position). A capture that cannot
  // be completed is dropped with a log line; it never fails the request.
  void Finish(Request& request, std::span<const std::uint32_t> generated = {});

  // Waits until every queued publish has been tried; the number that failed.
  std::size_t Drain();

  // Encodes and publishes one boundary now, on the calling thread (the
  // worker's path; also for tools that hold a capture already). Each chunk
  // is encoded from the views where they lie.
  Status Publish(std::span<const std::uint32_t> tokens, std::span<const engine::LayerSnapshotView> layers);
  Status Publish(std::span<const std::uint32_t> tokens, const std::vector<LayerSnapshot>& layers);

  // Allocates the staging a restore of a boundary this long needs (pinned
  // and, with device staging, device memory) and one pinned publish arena,
  // now rather than on the first request (an engine does this at start-up:
  // pinning hundreds of MiB takes a while).
  Status ReserveStaging(std::uint64_t tokens);

  // Whether restores stage on the device (PrefixCacheOptions::staging).
  bool device_staging() const { return device_staging_; }
  // Whether a device window is attached to the daemon (device_window_bytes).
  bool device_window() const { return !device_window_.empty(); }

  bool connected() const { return client_ != nullptr; }
  std::uint64_t published() const;
  // Encoded chunk bytes Publish has handed to the daemon, in all.
  std::uint64_t published_bytes() const { return published_bytes_.load(); }
  // Layers Publish encoded straight into the client's shared region.
  std::uint64_t in_place_layers() const { return in_place_layers_.load(); }

 private:
  // Restores the longest stored prefix of `tokens` into the fresh session;
  // 0 when nothing was restored (the session is then fresh again).
  // Fills the request's restore figures.
  Result<std::uint64_t> TryRestore(ModelSession& session, std::span<const std::uint32_t> tokens, Request* figures);
  // TryRestore for a rank of a TP engine (PrefixCacheOptions::tp; every
  // rank calls it at the same point, whatever its own lookup or fetch did);
  // prefix_cache_ranks.cc.
  Result<std::uint64_t> TryRestoreRank(ModelSession& session, std::span<const std::uint32_t> tokens,
                                       Request* figures);
  // Rank 0's lookup (or this rank's, without a collective): the hit (id 0:
  // none) and the branch point, the same on every rank.
  Result<std::pair<LookupHit, std::uint64_t>> AgreeOnHit(std::span<const std::uint32_t> tokens);
  // This rank's parts of `hit`, an entry whose part count this TP size
  // divides, fetched into the staging (`fetch`, made here), their
  // head-group parts gathered (StagedFetch::GatherParts) and validated
  // against the session's cache.
  Status FetchOwnParts(const LookupHit& hit, engine::SessionCache& cache, std::optional<StagedFetch>* fetch,
                       Request* figures);
  // An entry whose part count this TP size does not divide: this rank's
  // parts fetched, resharded on the host and validated.
  Result<std::vector<LayerSnapshot>> FetchResharded(const LookupHit& hit, engine::SessionCache& cache,
                                                    Request* figures);
  // A single-rank engine's restore of a TP entry's `hit`: FetchOwnParts,
  // then RestoreStaged; 0 when it was refused.
  Result<std::uint64_t> RestoreParts(ModelSession& session, const LookupHit& hit, Request* figures);
  // Restores the fetch's validated layers of `hit` (its length; the caller
  // sets the session's position).
  Result<std::uint64_t> RestoreStaged(ModelSession& session, const StagedFetch& fetch, const LookupHit& hit,
                                      Request* figures);
  // Restores validated snapshots of `hit` (its length; the caller sets the
  // session's position).
  Result<std::uint64_t> RestoreSnapshots(ModelSession& session, const std::vector<LayerSnapshot>& layers,
                                         const LookupHit& hit, Request* figures);
  // Logs a failed lookup, restore or publish: "the daemon is unavailable"
  // (once) when the connection is gone, else what the daemon answered.
  void NoteFailure(const std::string& what, const Status& why);
  void PublishLoop();
  // Where the prefill stops for an eager half: the branch point and the
  // checkpoints that lie in (restored, prompt), ascending.
  std::vector<std::uint64_t> PrefillCuts(const Request& r) const;
  // Primes the prompt from the restored prefix, taking an eager half at each cut.
  Status PrimeRest(Request& r, bool all_logits, std::vector<float>* logits);
  // Completes one capture into a pinned arena and queues its publish.
  void QueuePublish(engine::SessionCache& cache, engine::EagerHalf eager, std::vector<std::uint32_t> tokens);
  // One entry's publish (or one part's of a group), under publish_mu_.
  Result<PublishResult> PublishEntry(std::span<const std::uint32_t> tokens,
                                     std::span<const engine::LayerSnapshotView> layers,
                                     const std::optional<PublishGroup>& group);
  Status PublishLayer(client::PublishStream& stream, const engine::LayerSnapshotView& view);
  Status GrowStaging(std::uint64_t bytes);
  // Registers the client's current shared region with the device (again
  // after a reconnect gave it a new one); a failure only costs speed.
  void RegisterRegion();
  // Allocates, exports and attaches the device window when the daemon makes
  // device copies; a refusal is logged once and the region path stays.
  void AttachWindow();
  // A pinned arena of at least `bytes` (a free one, else a new one).
  Result<engine::Memory> TakeArena(std::uint64_t bytes);

  HybridModel* model_;
  std::unique_ptr<client::Client> client_;
  client::ModelId model_id_;
  PrefixCacheOptions options_;
  std::atomic<bool> warned_down_{false};
  bool device_staging_ = false;
  engine::Memory staging_;         // pinned; fetched layers decode into it
  engine::Memory device_staging_mem_;  // device; the restore's source with device staging
  void* registered_ = nullptr;     // the shared region registered with the device
  // Device; exported to the daemon, which copies raw chunks into it. Freed
  // only after the client is gone (the daemon maps it while connected).
  engine::Memory device_window_;
  bool window_refused_ = false;    // logged once; not tried again
  std::unique_ptr<WorkerPool> decode_pool_;
  std::unique_ptr<WorkerPool> encode_pool_;  // publishing's
  std::mutex publish_mu_;                 // held by Publish
  std::vector<std::byte> chunk_scratch_;  // under publish_mu_: where a large layer's chunks are encoded

  // A completed capture waiting for the worker: its planes in a pinned arena.
  struct Job {
    std::vector<std::uint32_t> tokens;
    engine::Memory arena;
    std::vector<engine::LayerSnapshotView> layers;
  };
  std::vector<engine::Memory> arenas_;  // free publish arenas (under mu_)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::size_t failed_ = 0;
  std::uint64_t published_ = 0;
  std::atomic<std::uint64_t> published_bytes_{0};
  std::atomic<std::uint64_t> in_place_layers_{0};
  std::thread worker_;
};

}  // namespace primecache::model
