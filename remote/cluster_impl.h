// ClusterClient::Impl: the slot map, the per-node connection pools, the
// circuit breaker, and the routing, retry and batch logic.
//
// Locks: map_mu_ (the slot map and the primaries; shared for routing,
// exclusive for a reload) and each NodePool's mu (its idle connections) are
// never held together; no lock is held across network I/O except
// refresh_mu_, which serialises reloads (a reload takes map_mu_ only to
// install the new map).
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "core/mutex.h"
#include "core/worker_pool.h"
#include "remote/cluster_client.h"
#include "remote/key_slot.h"
#include "remote/redis_conn.h"

namespace primecache::remote {

// One command of a batch; its final answer is set once RunBatch succeeds.
// A batch is all hiredis commands (argv, reply) or all data-path commands
// (a GET into `into` or a SET from `from`, sent and read past hiredis;
// remote/resp_reader.h).
struct BatchOp {
  enum class Path : std::uint8_t { kHiredis, kGetInto, kSetFrom };
  Path path = Path::kHiredis;
  std::vector<std::string> argv;  // hiredis: the command; argv[1] is the key
  ReplyPtr reply;                 // hiredis: its final reply
  std::string_view key;           // data path: the key
  std::span<std::byte> into;      // kGetInto: where a value of exactly this size lands
  // kGetInto: when set, gives `into` on the reading thread just before the
  // reply is read (so the caller touches its buffer while it is about to be
  // filled, not all of them ahead); called again if the op is resent.
  const std::function<std::span<std::byte>(std::size_t)>* provide = nullptr;
  std::span<const std::byte> from;  // kSetFrom: the value
  std::optional<RespReply> data;  // data path: its final reply
  Status failed;                  // data path: a reply that can never be right (malformed, over a bound)
  std::size_t index = 0;          // kGetInto: passed to *filled
  const std::function<void(std::size_t)>* filled = nullptr;  // kGetInto: called once `into` holds the value
  std::optional<Endpoint> ask;    // set while an ASK redirection is pending

  std::string_view Key() const { return path == Path::kHiredis ? std::string_view(argv[1]) : key; }
  bool answered() const { return !failed.ok() || (path == Path::kHiredis ? reply != nullptr : data.has_value()); }
  // The text of an error reply ("" for any other reply or none).
  std::string_view ErrorText() const;
  void Unanswer() {
    reply.reset();
    data.reset();
  }
};

// Opens after `failures` failed commands in a row; while open, refuses at
// once; after `open_for` lets commands through again, and the next failure
// reopens it at once, the next success closes it.
class Breaker {
 public:
  Breaker(int failures, std::chrono::milliseconds open_for) : limit_(failures), open_for_(open_for) {}
  bool Allow() const;
  void Success() { failed_.store(0, std::memory_order_relaxed); }
  // True when this failure opened the breaker.
  bool Failure();
  bool open() const { return !Allow(); }

 private:
  using Clock = std::chrono::steady_clock;
  const int limit_;
  const std::chrono::milliseconds open_for_;
  std::atomic<int> failed_{0};
  std::atomic<Clock::rep> open_until_{0};
};

class ClusterClient::Impl {
 public:
  explicit Impl(ClusterOptions options);

  const ClusterOptions& options() const { return options_; }
  Status Refresh();
  // Refresh after a failed command: a refusal of our credentials (AUTH, ACL:
  // kFailedPrecondition) is counted as a failure and returned, since asking
  // again cannot help; any other refresh error is left to the retries.
  Status RefreshUnlessRefused();
  std::vector<Endpoint> Primaries() const;
  Result<Endpoint> Owner(std::string_view key) const;

  // One command routed by `key`: its reply as text (ReplyText).
  Result<std::optional<std::string>> Text(std::string_view key, std::vector<std::string> argv);
  // Every op's final reply; fails as a whole when one op cannot be answered.
  Status RunBatch(std::vector<BatchOp>& ops);
  Result<std::vector<std::string>> Scan(std::string_view pattern, std::size_t limit);

  ClusterStats Stats() const;
  bool BreakerOpen() const { return breaker_.open(); }

 private:
  struct NodePool {
    Mutex mu;
    std::vector<std::unique_ptr<RedisConn>> idle GUARDED_BY(mu);
  };
  struct Counters {
    std::atomic<std::uint64_t> commands{0}, moved{0}, asked{0}, retries{0}, failures{0}, refreshes{0},
        breaker_opens{0}, fast_failures{0};
  };
  // A connection lent to one caller; returned to its pool unless dropped.
  class Lease {
   public:
    Lease(NodePool* pool, std::unique_ptr<RedisConn> conn) : pool_(pool), conn_(std::move(conn)) {}
    Lease(Lease&&) = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (!conn_) return;
      MutexLock l(&pool_->mu);
      pool_->idle.push_back(std::move(conn_));
    }
    RedisConn* operator->() const { return conn_.get(); }
    // The connection failed: close it instead of returning it.
    void Drop() { conn_.reset(); }

   private:
    NodePool* pool_;
    std::unique_ptr<RedisConn> conn_;
  };

  Result<Lease> Borrow(const Endpoint& at);
  Result<ReplyPtr> Exchange(const Endpoint& at, const std::vector<std::string>& argv, bool asking);
  Result<ReplyPtr> Routed(std::string_view key, const std::vector<std::string>& argv);
  Status LoadSlotsFrom(const Endpoint& at);
  void Pause(int attempt) const;
  void NoteFailure();
  // Sends every op of `group` to `at` in one pipeline; each op ends answered
  // (reply set), redirected (reply kept, to be resent) or unanswered (a lost
  // connection: reply null).
  void Pipeline(const Endpoint& at, std::span<BatchOp* const> group);
  // The same for data-path ops: up to pipeline_depth commands in flight.
  void PipelineData(Lease& conn, std::span<BatchOp* const> group);
  Status ReadDataReply(Lease& conn, BatchOp& op);
  // Groups the ops still to send by node and pipelines the groups in parallel.
  void SendRound(std::span<BatchOp* const> pending);

  const ClusterOptions options_;
  // Lock order: refresh_mu_, then map_mu_; pools_mu_, then a NodePool's mu.
  mutable SharedMutex map_mu_ ACQUIRED_AFTER(refresh_mu_);
  std::array<std::uint16_t, kClusterSlots> slot_owner_ GUARDED_BY(map_mu_){};  // index into primaries_
  std::vector<Endpoint> primaries_ GUARDED_BY(map_mu_);
  Mutex refresh_mu_;  // one slot-map refresh at a time
  Mutex pools_mu_;
  std::map<std::string, std::unique_ptr<NodePool>> pools_ GUARDED_BY(pools_mu_);  // entries never removed
  Breaker breaker_;
  Counters n_;
  WorkerPool workers_;
};

}  // namespace primecache::remote
