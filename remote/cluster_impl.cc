#include "remote/cluster_impl.h"

#include <condition_variable>
#include <thread>

namespace primecache::remote {
namespace {

constexpr std::uint16_t kNoOwner = 0xffff;
constexpr std::size_t kMaxHostBytes = 255;

bool IsInt(const redisReply* r, long long lo, long long hi) {
  return r->type == REDIS_REPLY_INTEGER && r->integer >= lo && r->integer <= hi;
}

// One entry of CLUSTER SLOTS: [first, last, [host, port, id...], replicas...].
Status ParseSlotRange(const redisReply* e, const Endpoint& asked, long long* first, long long* last, Endpoint* owner) {
  if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || !IsInt(e->element[0], 0, kClusterSlots - 1) ||
      !IsInt(e->element[1], e->element[0]->integer, kClusterSlots - 1)) {
    return Status::IOError("redis " + asked.ToString() + ": malformed CLUSTER SLOTS range");
  }
  const redisReply* node = e->element[2];
  if (node->type != REDIS_REPLY_ARRAY || node->elements < 2 || node->element[0]->type != REDIS_REPLY_STRING ||
      node->element[0]->len > kMaxHostBytes || !IsInt(node->element[1], 1, 65535)) {
    return Status::IOError("redis " + asked.ToString() + ": malformed CLUSTER SLOTS node");
  }
  *first = e->element[0]->integer;
  *last = e->element[1]->integer;
  owner->host.assign(node->element[0]->str, node->element[0]->len);
  // A node that does not know its own address answers an empty host: the one we asked.
  if (owner->host.empty() || owner->host == "?") owner->host = asked.host;
  owner->port = static_cast<int>(node->element[1]->integer);
  return Status::Ok();
}

}  // namespace

bool Breaker::Allow() const {
  return open_until_.load(std::memory_order_relaxed) <= Clock::now().time_since_epoch().count();
}

bool Breaker::Failure() {
  if (failed_.fetch_add(1, std::memory_order_relaxed) + 1 < limit_) return false;
  const Clock::rep now = Clock::now().time_since_epoch().count();
  const Clock::rep until = now + std::chrono::duration_cast<Clock::duration>(open_for_).count();
  return open_until_.exchange(until, std::memory_order_relaxed) <= now;
}

ClusterClient::Impl::Impl(ClusterOptions options)
    : options_(std::move(options)),
      breaker_(options_.breaker_failures, options_.breaker_open_for),
      workers_(options_.threads) {
  slot_owner_.fill(kNoOwner);
}

Result<ClusterClient::Impl::Lease> ClusterClient::Impl::Borrow(const Endpoint& at) {
  NodePool* pool;
  {
    MutexLock l(&pools_mu_);
    auto& slot = pools_[at.ToString()];
    if (!slot) slot = std::make_unique<NodePool>();
    pool = slot.get();
  }
  {
    MutexLock l(&pool->mu);
    if (!pool->idle.empty()) {
      auto conn = std::move(pool->idle.back());
      pool->idle.pop_back();
      return Lease(pool, std::move(conn));
    }
  }
  PC_ASSIGN_OR_RETURN(auto conn,
                      RedisConn::Open(at, options_.connect_timeout, options_.io_timeout, options_.auth));
  return Lease(pool, std::move(conn));
}

Result<ReplyPtr> ClusterClient::Impl::Exchange(const Endpoint& at, const std::vector<std::string>& argv, bool asking) {
  PC_ASSIGN_OR_RETURN(Lease conn, Borrow(at));
  Status s = asking ? conn->Append({"ASKING"}) : Status::Ok();
  if (s.ok()) s = conn->Append(argv);
  if (s.ok() && asking) s = conn->Read().status();
  if (!s.ok()) {
    conn.Drop();
    return s;
  }
  auto reply = conn->Read();
  if (!reply.ok()) conn.Drop();
  return reply;
}

Status ClusterClient::Impl::LoadSlotsFrom(const Endpoint& at) {
  PC_ASSIGN_OR_RETURN(ReplyPtr r, Exchange(at, {"CLUSTER", "SLOTS"}, false));
  if (r->type == REDIS_REPLY_ERROR) return ErrorReplyStatus("redis " + at.ToString(), {r->str, r->len});
  if (r->type != REDIS_REPLY_ARRAY || r->elements > kClusterSlots) {
    return Status::IOError("redis " + at.ToString() + ": CLUSTER SLOTS did not answer a slot list");
  }
  std::array<std::uint16_t, kClusterSlots> owner;
  owner.fill(kNoOwner);
  std::vector<Endpoint> primaries;
  for (std::size_t i = 0; i < r->elements; ++i) {
    long long first = 0, last = 0;
    Endpoint node;
    PC_RETURN_IF_ERROR(ParseSlotRange(r->element[i], at, &first, &last, &node));
    std::size_t idx = 0;
    while (idx < primaries.size() && !(primaries[idx] == node)) ++idx;
    if (idx == primaries.size()) primaries.push_back(node);
    for (long long s = first; s <= last; ++s) owner[static_cast<std::size_t>(s)] = static_cast<std::uint16_t>(idx);
  }
  MutexLock l(&map_mu_);
  slot_owner_ = owner;
  primaries_ = std::move(primaries);
  return Status::Ok();
}

Status ClusterClient::Impl::RefreshUnlessRefused() {
  Status refreshed = Refresh();
  if (refreshed.code() != StatusCode::kFailedPrecondition) return Status::Ok();
  NoteFailure();
  return refreshed;
}

Status ClusterClient::Impl::Refresh() {
  MutexLock l(&refresh_mu_);
  // The primaries we know first (a failed-over map is news they have), then the seeds.
  std::vector<Endpoint> ask = Primaries();
  ask.insert(ask.end(), options_.seeds.begin(), options_.seeds.end());
  Status last = Status::Unavailable("no redis node to ask for the slot map");
  for (const Endpoint& at : ask) {
    last = LoadSlotsFrom(at);
    if (last.ok()) {
      n_.refreshes.fetch_add(1, std::memory_order_relaxed);
      return last;
    }
  }
  // A refusal of who we are is the news, not that no node answered.
  if (last.code() == StatusCode::kFailedPrecondition) return last;
  return Status::Unavailable("no redis node answered CLUSTER SLOTS (last: " + last.message() + ")");
}

std::vector<Endpoint> ClusterClient::Impl::Primaries() const {
  ReaderLock l(&map_mu_);
  return primaries_;
}

Result<Endpoint> ClusterClient::Impl::Owner(std::string_view key) const {
  const std::uint16_t slot = KeySlot(key);
  ReaderLock l(&map_mu_);
  const std::uint16_t idx = slot_owner_[slot];
  if (idx == kNoOwner) return Status::Unavailable("redis slot " + std::to_string(slot) + " has no known owner");
  return primaries_[idx];
}

void ClusterClient::Impl::Pause(int attempt) const {
  auto wait = options_.backoff;
  for (int i = 1; i < attempt && wait < options_.backoff_max; ++i) wait *= 2;
  std::this_thread::sleep_for(std::min(wait, options_.backoff_max));
}

void ClusterClient::Impl::NoteFailure() {
  n_.failures.fetch_add(1, std::memory_order_relaxed);
  if (breaker_.Failure()) n_.breaker_opens.fetch_add(1, std::memory_order_relaxed);
}

Result<ReplyPtr> ClusterClient::Impl::Routed(std::string_view key, const std::vector<std::string>& argv) {
  if (!breaker_.Allow()) {
    n_.fast_failures.fetch_add(1, std::memory_order_relaxed);
    return Status::Unavailable("remote tier: circuit breaker open after repeated cluster failures");
  }
  Result<Endpoint> to = Owner(key);
  bool asking = false;
  for (int tries = 0, hops = 0;;) {
    Result<ReplyPtr> r = to.ok() ? Exchange(*to, argv, asking) : Result<ReplyPtr>(to.status());
    if (r.ok()) {
      const Redirect red = ParseRedirect(r->get());
      if (red.kind != Redirect::kNone && ++hops <= options_.max_redirects) {
        (red.kind == Redirect::kMoved ? n_.moved : n_.asked).fetch_add(1, std::memory_order_relaxed);
        if (red.kind == Redirect::kMoved) (void)Refresh();
        to = red.to;
        asking = red.kind == Redirect::kAsk;
        continue;
      }
      if (red.kind == Redirect::kNone && !IsTransientError(r->get())) {
        breaker_.Success();
        n_.commands.fetch_add(1, std::memory_order_relaxed);
        return r;
      }
      r = Status::IOError("redis " + to->ToString() + ": " + std::string((*r)->str, (*r)->len));
    }
    // A refusal of who we are (AUTH, ACL) is answered the same every time.
    if (++tries >= options_.attempts || r.status().code() == StatusCode::kFailedPrecondition) {
      NoteFailure();
      return r.status();
    }
    n_.retries.fetch_add(1, std::memory_order_relaxed);
    Pause(tries);
    PC_RETURN_IF_ERROR(RefreshUnlessRefused());
    to = Owner(key);
    asking = false;
  }
}

Result<std::optional<std::string>> ClusterClient::Impl::Text(std::string_view key, std::vector<std::string> argv) {
  PC_ASSIGN_OR_RETURN(ReplyPtr r, Routed(key, argv));
  return ReplyText(r.get(), options_.max_value_bytes);
}

ClusterStats ClusterClient::Impl::Stats() const {
  ClusterStats s;
  s.commands = n_.commands.load(std::memory_order_relaxed);
  s.moved = n_.moved.load(std::memory_order_relaxed);
  s.asked = n_.asked.load(std::memory_order_relaxed);
  s.retries = n_.retries.load(std::memory_order_relaxed);
  s.failures = n_.failures.load(std::memory_order_relaxed);
  s.refreshes = n_.refreshes.load(std::memory_order_relaxed);
  s.breaker_opens = n_.breaker_opens.load(std::memory_order_relaxed);
  s.fast_failures = n_.fast_failures.load(std::memory_order_relaxed);
  return s;
}

}  // namespace primecache::remote
