// The table of group publishes in progress (statestore/group.h).
#include "statestore/group.h"

#include <spdlog/spdlog.h>

#include "statestore/kill_point.h"

namespace primecache::statestore_internal {

struct GroupTable::Group {
  std::string key;
  std::uint32_t ranks = 0;
  std::chrono::steady_clock::time_point deadline;
  std::vector<bool> begun;
  std::vector<std::optional<StagedPart>> parked;
  std::uint32_t parked_count = 0;
  Status aborted;         // set: the group is over, and why
  bool finished = false;  // its last part took every part out
};

GroupTable::GroupTable(std::chrono::milliseconds timeout, std::function<void(StagedPart&)> abort_part)
    : timeout_(timeout), abort_part_(std::move(abort_part)) {
  reaper_ = std::thread([this] { ReapLoop(); });
}

GroupTable::~GroupTable() {
  Close();
}

void GroupTable::Close() {
  std::vector<StagedPart> back;
  {
    MutexLock l(&mu_);
    if (closing_) return;
    closing_ = true;
    for (auto& [key, g] : groups_) {
      if (!g->aborted.ok() || g->finished) continue;
      for (StagedPart& p : AbortLocked(*g, Status::Aborted("the store closed"))) back.push_back(std::move(p));
    }
    groups_.clear();
    cv_.SignalAll();
  }
  if (reaper_.joinable()) reaper_.join();
  GiveBack(std::move(back));
}

std::string GroupTable::KeyOf(const PublishRequest& req) {
  std::string k;
  k.append(reinterpret_cast<const char*>(&req.model), sizeof req.model);
  k.append(reinterpret_cast<const char*>(&req.group->token), sizeof req.group->token);
  const auto ns_len = static_cast<std::uint32_t>(req.ns.size());
  k.append(reinterpret_cast<const char*>(&ns_len), sizeof ns_len);
  k += req.ns;
  k.append(reinterpret_cast<const char*>(req.tokens.data()), req.tokens.size() * sizeof(std::uint32_t));
  return k;
}

Result<std::shared_ptr<GroupTable::Group>> GroupTable::Join(const PublishRequest& req, bool* first) {
  const PublishGroup& pg = *req.group;
  MutexLock l(&mu_);
  if (closing_) return Status::Aborted("the store is closing");
  const std::string key = KeyOf(req);
  auto it = groups_.find(key);
  *first = it == groups_.end();
  if (*first) {
    auto g = std::make_shared<Group>();
    g->key = key;
    g->ranks = pg.ranks;
    g->deadline = std::chrono::steady_clock::now() + timeout_;
    g->begun.assign(pg.ranks, false);
    g->parked.resize(pg.ranks);
    it = groups_.emplace(key, std::move(g)).first;
    cv_.SignalAll();  // the reaper learns of the new deadline
  }
  Group& g = *it->second;
  if (!g.aborted.ok()) return g.aborted;
  if (g.finished) return Status::AlreadyExists("group publish " + std::to_string(pg.token) + " is complete");
  if (pg.ranks != g.ranks) {
    return Status::InvalidArgument("group publish " + std::to_string(pg.token) + " has " +
                                   std::to_string(g.ranks) + " ranks; this part says " +
                                   std::to_string(pg.ranks));
  }
  if (g.begun[pg.rank]) {
    return Status::AlreadyExists("rank " + std::to_string(pg.rank) + " of group publish " +
                                 std::to_string(pg.token) + " began already");
  }
  g.begun[pg.rank] = true;
  return it->second;
}

std::vector<StagedPart> GroupTable::AbortLocked(Group& g, const Status& why) {
  std::vector<StagedPart> out;
  if (!g.aborted.ok() || g.finished) return out;
  g.aborted = Status::Aborted("group publish aborted: " + why.ToString());
  aborted_.fetch_add(1);
  for (auto& p : g.parked) {
    if (p) out.push_back(std::move(*p));
    p.reset();
  }
  g.parked_count = 0;
  return out;
}

void GroupTable::GiveBack(std::vector<StagedPart> parts) {
  for (StagedPart& p : parts) abort_part_(p);
}

void GroupTable::Abandon(const std::shared_ptr<Group>& group, const Status& why) {
  std::vector<StagedPart> back;
  {
    MutexLock l(&mu_);
    back = AbortLocked(*group, why);
  }
  GiveBack(std::move(back));
}

Result<std::optional<std::vector<StagedPart>>> GroupTable::Park(const std::shared_ptr<Group>& group,
                                                                std::uint32_t rank, StagedPart part) {
  std::optional<std::vector<StagedPart>> all;
  {
    MutexLock l(&mu_);
    Group& g = *group;
    if (g.aborted.ok() && !g.finished && !g.parked[rank]) {
      g.parked[rank] = std::move(part);
      if (++g.parked_count < g.ranks) {
        TEST_KILL_POINT("group.parked");
        return std::optional<std::vector<StagedPart>>();
      }
      all.emplace();
      for (auto& p : g.parked) {
        all->push_back(std::move(*p));
        p.reset();
      }
      g.finished = true;
    }
  }
  if (all) return all;
  abort_part_(part);  // the group is over: this part's bytes go back too
  MutexLock l(&mu_);
  return group->aborted.ok() ? Status::FailedPrecondition("rank " + std::to_string(rank) + " committed twice")
                             : group->aborted;
}

void GroupTable::Finish(const std::shared_ptr<Group>& group) {
  MutexLock l(&mu_);
  auto it = groups_.find(group->key);
  if (it != groups_.end() && it->second == group) groups_.erase(it);
}

std::size_t GroupTable::open_groups() const {
  MutexLock l(&mu_);
  std::size_t n = 0;
  for (const auto& [key, g] : groups_) n += g->aborted.ok() && !g->finished ? 1 : 0;
  return n;
}

// Wakes at the earliest deadline: a group past it is aborted (its parts
// given back) and, aborted or not, leaves the table.
void GroupTable::ReapLoop() {
  MutexLock l(&mu_);
  while (!closing_) {
    auto next = std::chrono::steady_clock::time_point::max();
    const auto now = std::chrono::steady_clock::now();
    std::vector<StagedPart> back;
    for (auto it = groups_.begin(); it != groups_.end();) {
      Group& g = *it->second;
      if (g.deadline > now) {
        next = std::min(next, g.deadline);
        ++it;
        continue;
      }
      for (StagedPart& p : AbortLocked(g, Status::DeadlineExceeded("not every rank committed in time"))) {
        back.push_back(std::move(p));
      }
      it = groups_.erase(it);
    }
    if (!back.empty()) {
      l.Unlock();
      spdlog::info("statestore: a group publish timed out; {} parked part(s) given back", back.size());
      GiveBack(std::move(back));
      l.Lock();
      continue;
    }
    if (next == std::chrono::steady_clock::time_point::max()) {
      cv_.Wait(&mu_);
    } else {
      cv_.WaitFor(&mu_, next - now);
    }
  }
}

}  // namespace primecache::statestore_internal
