// ClusterClient::Impl: batches (keys grouped by node, one pipeline per node,
// nodes in parallel, redirected or lost commands resent in later rounds) and
// SCAN over every primary.
#include <algorithm>

#include "remote/cluster_impl.h"

namespace primecache::remote {

namespace {

// "*<n>\r\n" and the bulk headers of a data-path command, up to (and, for
// a SET, without) its value; ASKING first when the op is redirected so.
std::string DataCommand(const BatchOp& op) {
  std::string out;
  if (op.ask) out += "*1\r\n$6\r\nASKING\r\n";
  const bool set = op.path == BatchOp::Path::kSetFrom;
  out += set ? "*3\r\n$3\r\nSET\r\n" : "*2\r\n$3\r\nGET\r\n";
  AppendBulkHeader(out, op.key.size());
  out += op.key;
  out += "\r\n";
  if (set) AppendBulkHeader(out, op.from.size());
  return out;
}

constexpr char kCrlf[] = "\r\n";

iovec Iov(const void* p, std::size_t n) { return iovec{const_cast<void*>(p), n}; }

}  // namespace

std::string_view BatchOp::ErrorText() const {
  if (path == Path::kHiredis) {
    return reply && reply->type == REDIS_REPLY_ERROR ? std::string_view(reply->str, reply->len) : std::string_view();
  }
  return data && data->kind == RespReply::Kind::kError ? std::string_view(data->text) : std::string_view();
}

// One reply of `op` (after its ASKING's, when redirected so). An error
// status means the connection is gone; `op.failed` is set when the reply
// can never be right.
Status ClusterClient::Impl::ReadDataReply(Lease& conn, BatchOp& op) {
  if (op.ask) {
    PC_ASSIGN_OR_RETURN(RespReply ok, conn->ReadData({}, 0));
    if (ok.kind != RespReply::Kind::kStatus) return Status::IOError("redis: ASKING was not answered OK");
  }
  const bool get = op.path == BatchOp::Path::kGetInto;
  if (get && op.provide != nullptr) op.into = (*op.provide)(op.index);
  Result<RespReply> r = conn->ReadData(get ? op.into : std::span<std::byte>(), get ? options_.max_value_bytes : 0);
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kCorruption) op.failed = r.status();
    return r.status();
  }
  if (r->kind == RespReply::Kind::kBulk && op.filled != nullptr && *op.filled) (*op.filled)(op.index);
  op.data = std::move(r).value();
  return Status::Ok();
}

// Sends the commands of `group` with at most pipeline_depth unanswered at a
// time, reading the replies as they come. Each op ends answered, or
// unanswered when the connection failed (it is dropped).
void ClusterClient::Impl::PipelineData(Lease& conn, std::span<BatchOp* const> group) {
  std::vector<std::string> heads(group.size());
  for (std::size_t i = 0; i < group.size(); ++i) heads[i] = DataCommand(*group[i]);
  const std::size_t depth = std::max<std::size_t>(1, options_.pipeline_depth);
  std::vector<iovec> iov;
  Status s = Status::Ok();
  for (std::size_t read = 0, sent = 0; read < group.size() && s.ok(); ++read) {
    iov.clear();
    for (; sent < group.size() && sent < read + depth; ++sent) {
      iov.push_back(Iov(heads[sent].data(), heads[sent].size()));
      if (group[sent]->path == BatchOp::Path::kSetFrom) {
        iov.push_back(Iov(group[sent]->from.data(), group[sent]->from.size()));
        iov.push_back(Iov(kCrlf, 2));
      }
    }
    if (!iov.empty()) s = conn->Send(iov);
    if (s.ok()) s = ReadDataReply(conn, *group[read]);
  }
  if (!s.ok()) conn.Drop();
}

void ClusterClient::Impl::Pipeline(const Endpoint& at, std::span<BatchOp* const> group) {
  auto conn = Borrow(at);
  if (!conn.ok()) {
    // A node that refuses who we are refuses every try: the batch fails with
    // its refusal. Any other failure leaves every op unanswered, to be retried.
    if (conn.status().code() == StatusCode::kFailedPrecondition) {
      for (BatchOp* op : group) op->failed = conn.status();
    }
    return;
  }
  if (group.front()->path != BatchOp::Path::kHiredis) return PipelineData(*conn, group);
  Status s = Status::Ok();
  for (BatchOp* op : group) {
    if (s.ok() && op->ask) s = (*conn)->Append({"ASKING"});
    if (s.ok()) s = (*conn)->Append(op->argv);
  }
  for (BatchOp* op : group) {
    if (s.ok() && op->ask) s = (*conn)->Read().status();
    if (!s.ok()) break;
    auto reply = (*conn)->Read();
    if (!reply.ok()) {
      s = reply.status();
      break;
    }
    op->reply = std::move(reply).value();
  }
  if (!s.ok()) conn->Drop();
}

void ClusterClient::Impl::SendRound(std::span<BatchOp* const> pending) {
  std::map<std::string, std::pair<Endpoint, std::vector<BatchOp*>>> groups;
  for (BatchOp* op : pending) {
    Result<Endpoint> to = op->ask ? Result<Endpoint>(*op->ask) : Owner(op->Key());
    if (!to.ok()) continue;  // no owner known: unanswered this round
    auto& g = groups[to->ToString()];
    g.first = *to;
    g.second.push_back(op);
  }
  // One node's group is cut into slices on separate connections when there
  // are threads to spare: one connection's replies are read by one thread,
  // which is what limits a large batch, not the node.
  const std::size_t per_node = std::max<std::size_t>(1, options_.threads / std::max<std::size_t>(1, groups.size()));
  std::vector<std::pair<const Endpoint*, std::span<BatchOp* const>>> slices;
  for (const auto& entry : groups) {
    const std::vector<BatchOp*>& ops = entry.second.second;
    const std::size_t step = (ops.size() + per_node - 1) / per_node;
    for (std::size_t at = 0; at < ops.size(); at += step) {
      slices.emplace_back(&entry.second.first, std::span(ops).subspan(at, std::min(step, ops.size() - at)));
    }
  }
  if (slices.size() == 1) {
    Pipeline(*slices[0].first, slices[0].second);
    return;
  }
  Mutex mu;
  CondVar cv;
  std::size_t left = slices.size();
  for (const auto& slice : slices) {
    workers_.Post([this, slice, &mu, &cv, &left] {
      Pipeline(*slice.first, slice.second);
      MutexLock l(&mu);
      if (--left == 0) cv.Signal();
    });
  }
  MutexLock l(&mu);
  while (left != 0) cv.Wait(&mu);
}

Status ClusterClient::Impl::RunBatch(std::vector<BatchOp>& ops) {
  if (ops.size() > options_.max_batch) {
    return Status::InvalidArgument("a redis batch of " + std::to_string(ops.size()) + " commands is over the limit of " +
                                   std::to_string(options_.max_batch));
  }
  if (!breaker_.Allow()) {
    n_.fast_failures.fetch_add(ops.size(), std::memory_order_relaxed);
    return Status::Unavailable("remote tier: circuit breaker open after repeated cluster failures");
  }
  std::vector<BatchOp*> pending;
  for (BatchOp& op : ops) pending.push_back(&op);
  for (int tries = 0, hops = 0; !pending.empty();) {
    SendRound(pending);
    std::vector<BatchOp*> next;
    bool moved = false, lost = false;
    for (BatchOp* op : pending) {
      if (!op->failed.ok()) return op->failed;
      const std::string_view error = op->ErrorText();
      const Redirect red = op->answered() ? ParseRedirect(error) : Redirect{};
      if (op->answered() && red.kind == Redirect::kNone && !IsTransientError(error)) {
        op->ask.reset();
        n_.commands.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      moved |= red.kind == Redirect::kMoved;
      lost |= red.kind == Redirect::kNone;
      if (red.kind == Redirect::kMoved) n_.moved.fetch_add(1, std::memory_order_relaxed);
      if (red.kind == Redirect::kAsk) n_.asked.fetch_add(1, std::memory_order_relaxed);
      op->ask = red.kind == Redirect::kAsk ? std::optional<Endpoint>(red.to) : std::nullopt;
      op->Unanswer();
      next.push_back(op);
    }
    pending = std::move(next);
    if (pending.empty()) break;
    if ((lost && ++tries >= options_.attempts) || (!lost && ++hops > options_.max_redirects)) {
      NoteFailure();
      return Status::Unavailable("redis batch: " + std::to_string(pending.size()) + " of " +
                                 std::to_string(ops.size()) + " commands unanswered after retries");
    }
    if (lost) {
      n_.retries.fetch_add(1, std::memory_order_relaxed);
      Pause(tries);
    }
    if (moved || lost) PC_RETURN_IF_ERROR(RefreshUnlessRefused());
  }
  breaker_.Success();
  return Status::Ok();
}

Result<std::vector<std::string>> ClusterClient::Impl::Scan(std::string_view pattern, std::size_t limit) {
  std::vector<std::string> keys;
  for (const Endpoint& at : Primaries()) {
    std::string cursor = "0";
    do {
      PC_ASSIGN_OR_RETURN(ReplyPtr r,
                          Exchange(at, {"SCAN", cursor, "MATCH", std::string(pattern), "COUNT", "1000"}, false));
      if (r->type == REDIS_REPLY_ERROR) {
        return ErrorReplyStatus("redis " + at.ToString() + " SCAN", {r->str, r->len});
      }
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
          r->element[1]->type != REDIS_REPLY_ARRAY) {
        return Status::IOError("redis " + at.ToString() + ": malformed SCAN reply");
      }
      cursor.assign(r->element[0]->str, r->element[0]->len);
      for (std::size_t i = 0; i < r->element[1]->elements; ++i) {
        PC_ASSIGN_OR_RETURN(auto key, ReplyText(r->element[1]->element[i], options_.max_value_bytes));
        if (!key) return Status::IOError("redis " + at.ToString() + ": SCAN answered a nil key");
        if (keys.size() == limit) return keys;
        keys.push_back(std::move(*key));
      }
    } while (cursor != "0");
  }
  return keys;
}

}  // namespace primecache::remote
