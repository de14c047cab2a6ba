// The lookup family: lookup, the longest stored prefix of a query, and the
// lookup a fetch by query begins with (session_fetch.cc).
#include <spdlog/spdlog.h>

#include <chrono>
#include <utility>

#include "ipc/session.h"
#include "ipc/wire.h"

namespace primecache::ipc {

std::optional<Answer> Session::ReadQuery(wire::Lookup::Reader l, Query* out) const {
  auto q = l.getQuery();
  if (auto refused = RefuseNamespace(q.getNamespace())) return refused;
  auto tokens = q.getTokens();
  if (tokens.size() > limits_.max_tokens) {
    return Answer(Status::InvalidArgument("query over " + std::to_string(limits_.max_tokens) + " tokens"));
  }
  out->digest = Hash128{q.getFingerprint().getDigestLo(), q.getFingerprint().getDigestHi()};
  out->tokens = ToVector(tokens);
  out->want_shared = l.getWantShared();
  out->arrived = std::chrono::steady_clock::now();
  return std::nullopt;
}

Result<Session::Found> Session::RunLookup(const Query& q, Lease* lease) {
  Found found;
  LookupOptions o;
  o.shared_tokens = q.want_shared ? &found.shared : nullptr;
  o.lease = lease;
  const auto started = std::chrono::steady_clock::now();
  auto hit = store_->Lookup(q.digest, ns_, q.tokens, o);
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  spdlog::debug("primecached: lookup of {} tokens{}{}: {:.2f} ms waiting for a thread, {:.2f} ms in the store",
                q.tokens.size(), q.want_shared ? " (and its branch point)" : "", lease ? " for a fetch" : "",
                ms(started - q.arrived), ms(std::chrono::steady_clock::now() - started));
  if (!hit.ok()) {
    counters_->lookup_errors.fetch_add(1, std::memory_order_relaxed);
    return hit.status();
  }
  if (*hit) counters_->hit_tokens.fetch_add((*hit)->length, std::memory_order_relaxed);
  found.hit = std::move(hit).value();
  return found;
}

Answer Session::OnLookup(const Incoming& in) {
  const std::uint64_t id = in.id;
  Query query;
  if (auto refused = ReadQuery(in.req.getLookup(), &query)) return std::move(*refused);
  return Serve(executor_, id, [this, id, q = std::move(query)]() -> Answer {
    auto found = RunLookup(q, nullptr);
    if (!found.ok()) return found.status();
    return BuildResponse(id, [&](wire::Response::Builder r) { WriteLookupHit(found->hit, found->shared, r.initLookup()); });
  });
}

}  // namespace primecache::ipc
