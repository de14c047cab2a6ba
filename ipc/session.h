// One client connection's protocol state, independent of the event loop.
//
// The server feeds a Session whole frames (on its loop thread); the Session
// decodes and checks each request there, then runs the store work through an
// Executor (worker threads) and sends responses through a ResponseSink. The
// fuzzer drives the same class with an inline executor and a sink that keeps
// what it is given, so decoding and dispatch are fuzzed exactly as served.
//
// Each handler returns the Answer to its request (ipc/session_answer.h): its
// reply, an error, or the queued answer of work that answers when it ends;
// Deliver, called by the dispatcher and by that work, is the one place an
// answer is sent. The handlers live by request family: session.cc (the
// dispatcher, hello, what the families share), session_publish.cc,
// session_fetch.cc (fetch and its windows), session_lookup.cc and
// session_admin.cc.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "core/thread_annotations.h"
#include "ipc/device_dma.h"
#include "ipc/framing.h"
#include "ipc/histogram.h"
#include "ipc/primecache.capnp.h"
#include "ipc/session_answer.h"
#include "ipc/shm.h"
#include "primecache/status.h"
#include "primecache/internal/store.h"

namespace primecache::ipc {

struct SessionLimits {
  FrameLimits frame;
  std::size_t max_chunk_bytes = 4u << 20;
  std::size_t max_header_bytes = 1u << 20;
  std::uint32_t max_layers = 4096;
  std::uint32_t max_chunks_per_layer = 1u << 20;
  std::size_t max_tokens = 1u << 20;
  std::size_t max_text_bytes = 256;
  std::size_t max_descriptor_bytes = StoreLimits::kMaxDescriptorBytes;  // the store's own bound
  std::uint32_t max_publishes_in_flight = 4;
  std::uint32_t max_fetches_in_flight = 8;
  std::uint32_t max_page_size = StoreLimits::kMaxListLimit;  // the store's own bound
  std::uint64_t max_shm_bytes = 4ull << 30;
  // Unapplied publish bytes after which the connection stops being read.
  std::size_t max_publish_backlog_bytes = 32u << 20;
  // Bytes (layer headers and chunks) of publishes begun and not yet
  // committed or aborted: on one connection, and on all of them together.
  // Past either, the publish that would cross it is refused and aborted.
  std::uint64_t max_uncommitted_bytes = 4ull << 30;
  std::uint64_t max_uncommitted_total_bytes = 16ull << 30;
  // An open publish that receives nothing (and has nothing being applied)
  // for this long is aborted, its bytes released. 0: never.
  std::chrono::milliseconds publish_timeout{60000};
};

// Where a session's responses go. Thread-safe.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void Send(std::unique_ptr<OutMessage> msg) = 0;
  // Blocks while the connection's unwritten bytes are above its bound.
  // False when the connection is gone (stop producing).
  virtual bool WaitForRoom() = 0;
  virtual bool Closed() const = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual void Post(std::function<void()> job) = 0;
};

struct PeerInfo {
  bool admin = false;      // accepted on the admin socket and passed its check
  bool local = true;       // Unix socket (shared memory allowed)
  uid_t uid = static_cast<uid_t>(-1);
  pid_t pid = 0;
  // Namespaces this peer may name in its hello; nullopt: any.
  std::optional<std::vector<std::string>> allowed_namespaces;
  // Non-empty: the peer may not use this socket; its first request is
  // answered permissionDenied with this text and the connection closed.
  std::string refused;
};

// Counters the server shares among sessions. The metrics endpoint
// (ipc/metrics.h) reads them from its own thread: each is an atomic (the
// histograms are made of them), updated where the work they count ends.
// Bytes counted by tensor-parallel rank: the chunk bytes of each rank's
// committed parts of group publishes, and what the fetches of connections
// that said they are a rank (Hello.tpRank) sent. Ranks at and beyond kRanks
// (StoreLimits::kMaxGroupRanks) cannot occur: the store and the hello refuse them.
// Thread-safe: Add from any thread, Snapshot meanwhile.
class RankBytes {
 public:
  static constexpr std::uint32_t kRanks = 1024;
  void Add(std::uint32_t rank, std::uint64_t bytes) {
    if (rank < kRanks && bytes != 0) bytes_[rank].fetch_add(bytes, std::memory_order_relaxed);
  }
  // Every rank counted so far, ascending: (rank, bytes).
  std::vector<std::pair<std::uint32_t, std::uint64_t>> Snapshot() const {
    std::vector<std::pair<std::uint32_t, std::uint64_t>> out;
    for (std::uint32_t r = 0; r < kRanks; ++r) {
      if (const std::uint64_t b = bytes_[r].load(std::memory_order_relaxed); b != 0) out.emplace_back(r, b);
    }
    return out;
  }

 private:
  std::array<std::atomic<std::uint64_t>, kRanks> bytes_{};
};

struct ServerCounters {
  std::atomic<std::uint32_t> connections{0};
  std::atomic<std::uint32_t> publishes_in_flight{0};
  std::atomic<std::uint64_t> uncommitted_bytes{0};  // of every open publish (SessionLimits)
  // Since the daemon started. Lookups' hits and misses are the store's own
  // counters (StoreStats); these are what the store does not count.
  std::atomic<std::uint64_t> lookup_errors{0};   // lookups the store answered with an error
  std::atomic<std::uint64_t> hit_tokens{0};      // tokens of the prefixes lookups found
  std::atomic<std::uint64_t> fetch_bytes{0};     // chunk bytes fetches sent (fetchDone.bytes, or as far as they got)
  std::atomic<std::uint64_t> fetch_errors{0};    // fetches answered with an error (cancelled ones included)
  std::atomic<std::uint64_t> publish_bytes{0};   // chunk bytes of committed publishes
  std::atomic<std::uint64_t> publish_errors{0};  // publishes a store step or the commit failed
  // Seconds from a fetch request's arrival to its fetchDone; from a
  // publishBegin's arrival to its commit's answer (successful ones).
  Histogram fetch_seconds{RequestSecondsBuckets()};
  Histogram publish_seconds{RequestSecondsBuckets()};
  // Shared regions attached now, their bytes, and the bytes of them that
  // fetched chunks occupy until the client releases them.
  std::atomic<std::uint64_t> shm_regions{0};
  std::atomic<std::uint64_t> shm_bytes{0};
  std::atomic<std::uint64_t> shm_bytes_in_use{0};
  // Times a fetch waited for a client to release room in its window (shared
  // or device): the client reads slower than the store, or its window is small.
  std::atomic<std::uint64_t> fetch_window_waits{0};
  // Chunks fetches sent through the shared and the device window, and the
  // fetchChunks that carried them (extents: FetchSender::AddTo).
  std::atomic<std::uint64_t> fetch_window_chunks_shm{0}, fetch_window_messages_shm{0};
  std::atomic<std::uint64_t> fetch_window_chunks_device{0}, fetch_window_messages_device{0};
  // The fetch pool's figures (FetchPool::Figures, stored by the pool at
  // every change): fetches holding a place, parked (without one: waiting
  // for their client, or back from that and waiting for a place) and not
  // started; its threads; and since the start, waits for a client parked and
  // those that kept their place because --max-parked-fetches were parked.
  std::atomic<std::uint64_t> fetch_pool_running{0}, fetch_pool_parked{0}, fetch_pool_queued{0};
  std::atomic<std::uint64_t> fetch_pool_threads{0};
  std::atomic<std::uint64_t> fetch_pool_parks{0}, fetch_pool_parks_refused{0};
  RankBytes rank_publish_bytes, rank_fetch_bytes;
};

struct FetchState;  // ipc/fetch_sender.h

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `executor` runs short store work; `fetch_executor` runs fetches, which
  // may wait on a slow reader (they never hold up the short work).
  // `device_dma` (may be null: no device copies) outlives the session.
  // `remote_stats`, when set, gives the remote tier's figures for Stat
  // (DaemonStats::remote).
  Session(Store* store, Executor* executor, Executor* fetch_executor, std::shared_ptr<ResponseSink> sink,
          SessionLimits limits, PeerInfo peer, ServerCounters* counters, DeviceDma* device_dma = nullptr,
          std::function<std::optional<RemoteStats>()> remote_stats = {});
  ~Session();

  // What becomes of the connection after a frame. Only the session's own
  // refusal of the peer (PeerInfo::refused) or a session already closed
  // ends it; a request's error is answered and the connection kept.
  enum class Connection { kKeep, kClose };
  // Handles one frame; `fds` are descriptors that arrived with its bytes (the
  // session takes them). kClose: close the connection (after flushing).
  Connection OnFrame(Frame frame, std::vector<int>* fds);
  // The connection is gone: abort open publishes, stop fetches.
  void OnClose();
  // True while applying queued publish data lags too far behind: stop reading.
  bool InboundBlocked() const;
  // Called by a worker when the backlog has drained (set by the server).
  void SetUnblockedCallback(std::function<void()> cb) { unblocked_cb_ = std::move(cb); }

  // For the server's deadlines (loop thread).
  bool hello_done() const { return hello_done_; }
  // A request is being served: a publish is open, a fetch streams, or a
  // request's store work has not answered yet.
  bool Busy() const;
  // When the session last finished a request's work (steady clock).
  std::chrono::steady_clock::time_point last_answer() const;
  // Aborts the open publishes that made no progress for the publish
  // timeout, telling the client (an id-0 deadlineExceeded notice).
  void ExpireStalledPublishes(std::chrono::steady_clock::time_point now);

  struct Publish;

 private:
  // A request being dispatched: its id and reader, the frame it came in (a
  // handler that keeps bytes of it past its return moves it out of
  // `owned`), and the descriptors passed with it.
  struct Incoming {
    std::uint64_t id;
    wire::Request::Reader req;
    Frame* owned;
    std::vector<int>* fds;
  };
  // Checks what every request needs (the hello first), then hands the
  // request to its handler and delivers the handler's answer.
  Connection Dispatch(const Frame& frame, Frame* owned, std::vector<int>* fds);
  // The handler of the request's kind.
  Answer Handle(const Incoming& in);
  // Sends `answer` to the client as the answer to request `id` (a queued one:
  // nothing yet, its work delivers its own): the one place where a handler's
  // reply or error becomes a response.
  void Deliver(std::uint64_t id, Answer answer);
  // Runs a request's store work on `executor`, counted as in flight; the
  // Answer it returns answers `id`. Returns the queued answer.
  Answer Serve(Executor* executor, std::uint64_t id, std::function<Answer()> job);
  Answer OnHello(const Incoming& in);
  // The namespace an entry must be of for this peer: its own, or none for
  // the admin socket (the store checks it where it reads the entry anyway).
  std::optional<std::string> TenantScope() const;
  // A boundary's or query's namespace: empty (the connection's) or the
  // connection's own; otherwise the refusal to answer with.
  std::optional<Answer> RefuseNamespace(capnp::Text::Reader ns) const;

  // ---- publish (session_publish.cc)
  Answer OnPublishBegin(const Incoming& in);
  // publishLayer, publishChunk, publishCommit, publishAbort: the open
  // publish they name, checked against the protocol's order.
  Answer OnPublishStep(const Incoming& in);
  Answer OnPublishLayer(const Incoming& in, const std::shared_ptr<Publish>& pub);
  Answer OnPublishChunk(const Incoming& in, const std::shared_ptr<Publish>& pub);
  Answer OnPublishEnd(const Incoming& in, const std::shared_ptr<Publish>& pub);
  // Commit, abort or a broken order: the publish leaves the table for
  // `ending_` until its queue has finished it.
  void EndPublish(const std::shared_ptr<Publish>& pub);
  // A request broke the publish's order: it leaves the table, its staged
  // work is dropped, and `s` answers `id` after every earlier step's answer.
  Answer AbortPublish(const std::shared_ptr<Publish>& pub, std::uint64_t id, Status s);
  // Queues `step` behind the publish's earlier work (counting `bytes` of
  // backlog); the Answer it returns answers `id`, and then, with kFinish,
  // the publish is finished. Returns the queued answer.
  enum class AfterAnswer { kNothing, kFinish };
  Answer RunPublishStep(const std::shared_ptr<Publish>& pub, std::uint64_t id, std::size_t bytes,
                        std::function<Answer()> step, AfterAnswer after = AfterAnswer::kNothing);
  // Queues the publish's end where no request waits for it (the connection
  // closed, the publish timed out): finished, nothing answered.
  void QueueFinishPublish(const std::shared_ptr<Publish>& pub);
  void RunPublishOp(const std::shared_ptr<Publish>& pub, std::size_t bytes, std::function<void()> op);
  void FinishPublish(const std::shared_ptr<Publish>& pub);
  // Drops a finished publish from `ending_` (worker, after the op that
  // finished it has answered).
  void ForgetEnded(const Publish& pub);
  // A store step of the publish failed with `s`: later steps of it answer
  // the same, and nothing of it stays staged or counted. Returns the error
  // the failed step answers with.
  Status FailPublish(const std::shared_ptr<Publish>& pub, Status s);
  void ReleaseBacklog(std::size_t bytes);
  // Counts `bytes` against the connection's and the daemon's bound on
  // uncommitted publish bytes; ResourceExhausted (naming the limit) past one.
  Status ReserveUncommitted(Publish& pub, std::size_t bytes);
  void ReleaseUncommitted(Publish& pub);
  // Why publish `publish` was aborted by its deadline; empty if it was not.
  std::string ExpiredReason(std::uint64_t publish) const;
  static constexpr std::size_t kExpiredKept = 16;

  // ---- fetch and the windows it fills (session_fetch.cc)
  Answer OnFetch(const Incoming& in);
  Answer OnCancel(const Incoming& in);
  Answer OnCheckEntry(const Incoming& in);
  Answer OnShmAttach(const Incoming& in);
  // attachDevice: opens the engine's exported memory on a worker.
  Answer OnAttachDevice(const Incoming& in);
  // shmRelease / deviceRelease: gives a fetched chunk's window space back.
  // The protocol answers neither (id 0); nullopt unless refused.
  std::optional<Answer> OnWindowRelease(const Incoming& in);
  // A fetch's windows from its request (shared, device).
  Status OpenWindows(wire::Fetch::Reader f, FetchState& st);
  // Registers `st` under its id unless the id runs already, the connection
  // has its most fetches in flight, or its windows overlap another fetch's.
  Status AddFetchInFlight(const std::shared_ptr<FetchState>& st) EXCLUDES(mu_);

  // ---- lookup (session_lookup.cc)
  Answer OnLookup(const Incoming& in);
  // A lookup's query, read and checked on the loop thread (lookup, and a
  // fetch by query).
  struct Query {
    Hash128 digest;
    std::vector<std::uint32_t> tokens;
    bool want_shared = false;
    std::chrono::steady_clock::time_point arrived;
  };
  // Reads `l` into `out`; the refusal to answer with, if any.
  std::optional<Answer> ReadQuery(wire::Lookup::Reader l, Query* out) const;
  // What a lookup found: the hit (leased into `lease` when given) and, when
  // the query asked, its branch point.
  struct Found {
    std::optional<LookupHit> hit;
    std::uint64_t shared = 0;
  };
  // The store's lookup of `q`, counted and logged (on a worker).
  Result<Found> RunLookup(const Query& q, Lease* lease);

  // ---- admin and the store's views (session_admin.cc)
  // delete, setByteBudget and compact.
  Answer OnAdminOp(const Incoming& in);
  Answer OnList(const Incoming& in);
  Answer OnStat(const Incoming& in);
  Answer OnDescribe(const Incoming& in);
  Answer OnCheckStore(const Incoming& in);

  Store* store_;
  std::function<std::optional<RemoteStats>()> remote_stats_;
  Executor* executor_;
  Executor* fetch_executor_;
  std::shared_ptr<ResponseSink> sink_;
  SessionLimits limits_;
  PeerInfo peer_;
  ServerCounters* counters_;
  DeviceDma* device_dma_;

  // Loop-thread state.
  bool hello_done_ = false;
  std::string ns_;
  std::optional<std::uint32_t> tp_rank_;  // Hello.tpRank: a rank of a TP engine
  std::shared_ptr<ShmRegion> shm_;

  mutable Mutex mu_;  // guards the maps, the count and the backlog below
  std::map<std::uint64_t, std::shared_ptr<Publish>> publishes_ GUARDED_BY(mu_);
  // Publishes ended (commit, abort, a broken order) whose queue has not yet
  // finished them: a later step naming one is answered from its queue, so
  // that it too comes after the publish's earlier answers.
  std::map<std::uint64_t, std::shared_ptr<Publish>> ending_ GUARDED_BY(mu_);
  std::map<std::uint64_t, std::shared_ptr<FetchState>> fetches_ GUARDED_BY(mu_);
  std::shared_ptr<DeviceWindow> device_ GUARDED_BY(mu_);  // attached (attachDevice); fetches keep their own
  std::uint32_t publishes_open_ GUARDED_BY(mu_) = 0;      // begun and not yet finished (commit/abort done)
  std::size_t backlog_bytes_ GUARDED_BY(mu_) = 0;
  std::uint64_t uncommitted_ GUARDED_BY(mu_) = 0;  // this connection's share of counters_->uncommitted_bytes
  // Publishes aborted by their deadline, newest last (a few), so that a
  // late request for one says why it is gone.
  std::deque<std::pair<std::uint64_t, std::string>> expired_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
  std::atomic<std::uint32_t> jobs_in_flight_{0};
  std::atomic<std::int64_t> last_answer_ns_{0};  // steady clock
  std::function<void()> unblocked_cb_;
};

}  // namespace primecache::ipc
