// The lookup family: lookup, the longest stored prefix of a query.
#include <spdlog/spdlog.h>

#include <chrono>
#include <utility>

#include "ipc/session.h"
#include "ipc/wire.h"

namespace primecache::ipc {

Answer Session::OnLookup(const Incoming& in) {
  const std::uint64_t id = in.id;
  auto q = in.req.getLookup().getQuery();
  if (auto refused = RefuseNamespace(q.getNamespace())) return std::move(*refused);
  auto tokens = q.getTokens();
  if (tokens.size() > limits_.max_tokens) {
    return Status::InvalidArgument("query over " + std::to_string(limits_.max_tokens) + " tokens");
  }
  Hash128 digest{q.getFingerprint().getDigestLo(), q.getFingerprint().getDigestHi()};
  std::vector<std::uint32_t> toks = ToVector(tokens);
  const bool want_shared = in.req.getLookup().getWantShared();
  const auto arrived = std::chrono::steady_clock::now();
  return Serve(executor_, id, [this, id, digest, want_shared, arrived, toks = std::move(toks)]() -> Answer {
    std::uint64_t shared = 0;
    LookupOptions o;
    o.shared_tokens = want_shared ? &shared : nullptr;
    const auto started = std::chrono::steady_clock::now();
    auto hit = store_->Lookup(digest, ns_, toks, o);
    auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    spdlog::debug("primecached: lookup of {} tokens{}: {:.2f} ms waiting for a thread, {:.2f} ms in the store",
                  toks.size(), want_shared ? " (and its branch point)" : "", ms(started - arrived),
                  ms(std::chrono::steady_clock::now() - started));
    if (!hit.ok()) {
      counters_->lookup_errors.fetch_add(1, std::memory_order_relaxed);
      return hit.status();
    }
    if (*hit) counters_->hit_tokens.fetch_add((*hit)->length, std::memory_order_relaxed);
    return BuildResponse(id, [&](wire::Response::Builder r) { WriteLookupHit(*hit, shared, r.initLookup()); });
  });
}

}  // namespace primecache::ipc
