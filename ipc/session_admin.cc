// The admin family and the store's views: delete, setByteBudget, compact,
// checkStore (the admin socket's), and list, stat and describe.
#include <algorithm>
#include <utility>

#include "ipc/process_memory.h"
#include "ipc/session.h"
#include "ipc/wire.h"

namespace primecache::ipc {

// delete, setByteBudget and compact: admin requests answered with an ack.
Answer Session::OnAdminOp(const Incoming& in) {
  const std::uint64_t id = in.id;
  const wire::Request::Reader req = in.req;
  const auto which = in.req.which();
  if (!peer_.admin) {
    return Answer::PermissionDenied("delete, setByteBudget and compact are served on the admin socket only");
  }
  std::function<Status()> op;
  if (which == wire::Request::DELETE) {
    op = [this, entry = req.getDelete().getEntry()] { return store_->Delete(entry); };
  } else if (which == wire::Request::SET_BYTE_BUDGET) {
    op = [this, bytes = req.getSetByteBudget().getBytes()] { return store_->SetByteBudget(bytes); };
  } else {
    op = [this] { return store_->Compact(); };
  }
  return Serve(executor_, id, [id, op = std::move(op)]() -> Answer {
    Status s = op();
    if (!s.ok()) return s;
    return Answer::Ack(id);
  });
}

Answer Session::OnList(const Incoming& in) {
  const std::uint64_t id = in.id;
  auto lr = in.req.getList();
  ListOptions filter;
  if (lr.getDigestLo() != 0 || lr.getDigestHi() != 0) filter.model = Hash128{lr.getDigestLo(), lr.getDigestHi()};
  if (lr.getAllNamespaces()) {
    if (!peer_.admin) return Answer::PermissionDenied("listing every namespace needs the admin socket");
  } else {
    filter.ns = ns_;
  }
  if (lr.getQuarantined() && !peer_.admin) {
    return Answer::PermissionDenied("listing quarantined entries needs the admin socket");
  }
  filter.state = lr.getQuarantined() ? EntryState::kQuarantined : EntryState::kLive;
  filter.omit_tokens = lr.getOmitTokens();
  if (lr.getPageToken().size() > 4096) return Status::InvalidArgument("page token over 4096 bytes");
  filter.page_token.assign(reinterpret_cast<const char*>(lr.getPageToken().begin()), lr.getPageToken().size());
  filter.limit = lr.getPageSize() == 0 ? 100 : std::min(lr.getPageSize(), limits_.max_page_size);
  return Serve(executor_, id, [this, id, filter]() -> Answer {
    auto page = store_->List(filter);
    if (!page.ok()) return page.status();
    return BuildResponse(id, [&](wire::Response::Builder r) { WriteListPage(*page, r.initList()); },
                         WordsFor(*page));
  });
}

Answer Session::OnStat(const Incoming& in) {
  const std::uint64_t id = in.id;
  if (peer_.allowed_namespaces.has_value()) {
    // The totals are the whole store's, every tenant's together.
    return Answer::PermissionDenied("stat reports the whole store, every namespace together; uid " +
                                    std::to_string(peer_.uid) +
                                    " is limited to its tenant namespaces (the admin socket serves it)");
  }
  return Serve(executor_, id, [this, id]() -> Answer {
    auto st = store_->Stat();
    if (!st.ok()) return st.status();
    DaemonStats d;
    d.store = std::move(st).value();
    d.connections = counters_->connections.load();
    d.publishes_in_flight = counters_->publishes_in_flight.load();
    d.uncommitted_bytes = counters_->uncommitted_bytes.load();
    d.fetch_window_waits = counters_->fetch_window_waits.load();
    AddProcessMemory(&d);
    if (remote_stats_) d.remote = remote_stats_();
    return BuildResponse(id, [&](wire::Response::Builder r) { WriteDaemonStats(d, r.initStat()); });
  });
}

Answer Session::OnDescribe(const Incoming& in) {
  const std::uint64_t id = in.id;
  const std::uint64_t entry = in.req.getDescribe().getEntry();
  const bool headers = in.req.getDescribe().getLayerHeaders();
  return Serve(executor_, id, [this, id, entry, headers]() -> Answer {
    // Other tenants' entries, and quarantined ones off the admin socket,
    // are reported as absent.
    auto d = store_->Describe(entry, DescribeOptions{TenantScope(), headers});
    if (!d.ok()) return d.status();
    return BuildResponse(id, [&](wire::Response::Builder r) { WriteEntryDetail(*d, r.initDescribe()); },
                         WordsFor(*d));
  });
}

Answer Session::OnCheckStore(const Incoming& in) {
  const std::uint64_t id = in.id;
  if (!peer_.admin) return Answer::PermissionDenied("checkStore is served on the admin socket only");
  const bool read_chunks = in.req.getCheckStore().getReadChunks();
  return Serve(executor_, id, [this, id, read_chunks]() -> Answer {
    auto report = store_->CheckStore(CheckStoreOptions{read_chunks});
    if (!report.ok()) return report.status();
    return BuildResponse(
        id, [&](wire::Response::Builder r) { WriteStoreCheckReport(*report, r.initStoreCheckReport()); },
        WordsFor(*report));
  });
}

}  // namespace primecache::ipc
