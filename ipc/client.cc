// The client's calls other than publish and fetch: lookup, list, stat,
// describe, the checks and the admin calls; and the request fields they
// share (ipc/client_impl.h says where the rest of the client lives).
#include "ipc/client_impl.h"

#include <limits>
#include <string>
#include <vector>

namespace primecache::client {

void SetFingerprint(wire::Fingerprint::Builder fp, const ModelId& m) {
  fp.setDigestLo(m.digest.lo);
  fp.setDigestHi(m.digest.hi);
  fp.setName(m.name);
  fp.setDescriptor(kj::arrayPtr(reinterpret_cast<const kj::byte*>(m.descriptor.data()), m.descriptor.size()));
}

void SetTokens(wire::Boundary::Builder b, std::span<const std::uint32_t> tokens) {
  auto t = b.initTokens(static_cast<unsigned>(tokens.size()));
  for (unsigned i = 0; i < tokens.size(); ++i) t.set(i, tokens[i]);
  b.setLength(static_cast<std::uint32_t>(tokens.size()));
}

Result<std::optional<LookupHit>> Client::Lookup(const ModelId& model, std::span<const std::uint32_t> tokens) {
  return Lookup(model, tokens, nullptr);
}

Result<std::optional<LookupHit>> Client::Lookup(const ModelId& model, std::span<const std::uint32_t> tokens,
                                                std::uint64_t* shared_tokens) {
  return impl_->Retry([&]() -> Result<std::optional<LookupHit>> {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    const std::uint64_t id = impl_->NextId();
    auto m = BuildRequest(
        id,
        [&](wire::Request::Builder r) {
          auto l = r.initLookup();
          l.setWantShared(shared_tokens != nullptr);
          auto q = l.initQuery();
          SetFingerprint(q.initFingerprint(), model);
          q.setNamespace(impl_->opts.ns);
          SetTokens(q, tokens);
        },
        tokens.size() / 2 + 64);
    PC_ASSIGN_OR_RETURN(Result<std::optional<LookupHit>> read,
                        Expect<Result<std::optional<LookupHit>>>(
                            impl_->Call(c, id, *m), c->limits, wire::Response::LOOKUP,
                            [&](wire::Response::Reader r) -> Result<std::optional<LookupHit>> {
                              PC_ASSIGN_OR_RETURN(auto hit, ipc::ReadLookupHit(r.getLookup(), tokens.size()));
                              if (shared_tokens != nullptr) {
                                // An older daemon answers 0: the hit's length is then all that is known.
                                *shared_tokens = std::clamp<std::uint64_t>(
                                    r.getLookup().getSharedTokens(), hit ? hit->length : 0, tokens.size());
                              }
                              return hit;
                            }));
    return read;
  });
}

// ---- the rest -------------------------------------------------------------------

Result<ListPage> Client::List(const ListOptions& options) {
  if (options.limit == 0 || options.limit > std::numeric_limits<std::uint32_t>::max()) {
    return Status::InvalidArgument("list limit " + std::to_string(options.limit) + " out of range");
  }
  // The wire lists the connection's namespace or every one.
  const bool all_namespaces = options.ns ? *options.ns != impl_->opts.ns : server_info().admin;
  auto page = impl_->Retry([&]() -> Result<ListPage> {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    const std::uint64_t id = impl_->NextId();
    auto m = BuildRequest(id, [&](wire::Request::Builder r) {
      auto l = r.initList();
      if (options.model) {
        l.setDigestLo(options.model->lo);
        l.setDigestHi(options.model->hi);
      }
      l.setPageToken(KjBytes(std::as_bytes(std::span(options.page_token.data(), options.page_token.size()))));
      l.setPageSize(static_cast<std::uint32_t>(options.limit));
      l.setAllNamespaces(all_namespaces);
      l.setQuarantined(options.state == EntryState::kQuarantined);
      l.setOmitTokens(options.omit_tokens);
    });
    return Expect<ListPage>(impl_->Call(c, id, *m), c->limits, wire::Response::LIST,
                            [](wire::Response::Reader r) { return ipc::ReadListPage(r.getList()); });
  });
  if (page.ok() && all_namespaces && options.ns) {
    std::erase_if(page->entries, [&](const EntryInfo& e) { return e.ns != *options.ns; });
  }
  return page;
}

Result<DaemonStats> Client::Stat() {
  return impl_->Retry([&]() -> Result<DaemonStats> {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    const std::uint64_t id = impl_->NextId();
    auto m = BuildRequest(id, [](wire::Request::Builder r) { r.setStat(); });
    return Expect<DaemonStats>(impl_->Call(c, id, *m), c->limits, wire::Response::STAT,
                               [](wire::Response::Reader r) { return ipc::ReadDaemonStats(r.getStat()); });
  });
}

Result<EntryCheckReport> Client::CheckEntry(std::uint64_t entry) {
  return impl_->Retry([&]() -> Result<EntryCheckReport> {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    const std::uint64_t id = impl_->NextId();
    auto m = BuildRequest(id, [&](wire::Request::Builder r) { r.initCheckEntry().setEntry(entry); });
    return Expect<EntryCheckReport>(impl_->Call(c, id, *m), c->limits, wire::Response::CHECK_ENTRY, [](wire::Response::Reader r) {
      auto v = r.getCheckEntry();
      return EntryCheckReport{v.getOk(), v.getMessage(), v.getLayers(), v.getBytes()};
    });
  });
}

Result<EntryDetail> Client::Describe(std::uint64_t entry, const DescribeOptions& options) {
  auto detail = impl_->Retry([&]() -> Result<EntryDetail> {
    PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
    const std::uint64_t id = impl_->NextId();
    auto m = BuildRequest(id, [&](wire::Request::Builder r) {
      auto d = r.initDescribe();
      d.setEntry(entry);
      d.setLayerHeaders(options.layer_headers);
    });
    return Expect<EntryDetail>(impl_->Call(c, id, *m), c->limits, wire::Response::DESCRIBE,
                               [](wire::Response::Reader r) { return ipc::ReadEntryDetail(r.getDescribe()); });
  });
  // Another namespace's entry, or a quarantined one asked for by namespace,
  // is reported as absent (the daemon checks the connection's own).
  if (detail.ok() && options.ns && (detail->info.quarantined() || detail->info.ns != *options.ns)) {
    return Status::NotFound("no entry " + std::to_string(entry));
  }
  return detail;
}

Result<StoreCheckReport> Client::CheckStore(bool read_chunks) {
  PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
  const std::uint64_t id = impl_->NextId();
  auto m = BuildRequest(id, [&](wire::Request::Builder r) { r.initCheckStore().setReadChunks(read_chunks); });
  return Expect<StoreCheckReport>(impl_->Call(c, id, *m), c->limits, wire::Response::STORE_CHECK_REPORT,
                              [](wire::Response::Reader r) { return ipc::ReadStoreCheckReport(r.getStoreCheckReport()); });
}

Status Client::Compact() {
  PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
  const std::uint64_t id = impl_->NextId();
  auto m = BuildRequest(id, [](wire::Request::Builder r) { r.setCompact(); });
  auto reply = impl_->Call(c, id, *m);
  return reply.ok() ? Status::Ok() : reply.status();
}

Status Client::Delete(std::uint64_t entry) {
  PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
  const std::uint64_t id = impl_->NextId();
  auto m = BuildRequest(id, [&](wire::Request::Builder r) { r.initDelete().setEntry(entry); });
  auto reply = impl_->Call(c, id, *m);
  return reply.ok() ? Status::Ok() : reply.status();
}

Status Client::SetByteBudget(std::uint64_t bytes) {
  PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
  const std::uint64_t id = impl_->NextId();
  auto m = BuildRequest(id, [bytes](wire::Request::Builder r) { r.initSetByteBudget().setBytes(bytes); });
  auto reply = impl_->Call(c, id, *m);
  return reply.ok() ? Status::Ok() : reply.status();
}

std::future<Result<std::optional<LookupHit>>> Client::LookupAsync(const ModelId& model, std::vector<std::uint32_t> tokens) {
  return std::async(std::launch::async,
                    [this, model, tokens = std::move(tokens)] { return Lookup(model, tokens); });
}

std::future<Result<DaemonStats>> Client::StatAsync() {
  return std::async(std::launch::async, [this] { return Stat(); });
}

}  // namespace primecache::client
