// A Store over the daemon (primecache/internal/store.h): each operation is the Client
// call of the same name (primecache/client.h), so that a program written
// against Store runs on the local store or through primecached alike
// (primecachectl does both).
//
// What differs from a local store, as the protocol has it:
//  - a lookup or a publish lands in the namespace of its connection: one of
//    another namespace than the client's goes through a connection of its
//    own (the same options, that namespace), made for the call;
//  - the daemon records every lookup (LookupOptions::record is not on the
//    wire); leases are the daemon's (LookupOptions::lease: kInvalidArgument);
//  - a publish is sent whole at Commit (the wire announces the layer count
//    up front, which a Publisher learns only at the end);
//  - fetched chunks are handed out as OnChunk only (no zero-copy hooks);
//  - Delete, SetByteBudget, CheckStore and Compact need the admin socket.
// The daemon's own figures (DaemonStats) come from DaemonStat.
//
// Thread-safety: as Client (every method from many threads at once).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "primecache/client.h"
#include "primecache/entry.h"
#include "primecache/status.h"
#include "primecache/internal/store.h"

namespace primecache::client {

class DaemonStore final : public Store {
 public:
  // `client` was connected with `options` (its endpoint and timeouts also
  // connect the other namespaces' calls).
  DaemonStore(ClientOptions options, std::unique_ptr<Client> client);
  // Connects with `options`.
  static Result<std::unique_ptr<DaemonStore>> Connect(ClientOptions options);

  Client& client() { return *client_; }
  const ClientOptions& options() const { return options_; }
  // The daemon's figures: its store's (Stat) and its own.
  Result<DaemonStats> DaemonStat();

  Result<PublishStart> BeginPublish(PublishRequest request) override;
  Result<std::optional<LookupHit>> Lookup(const Hash128& model, std::string_view ns,
                                          std::span<const std::uint32_t> tokens,
                                          const LookupOptions& options = {}) override;
  Result<EntryDetail> Describe(EntryId id, const DescribeOptions& options = {}) override;
  Status Fetch(EntryId id, std::span<const std::uint32_t> layers, FetchSink& sink,
               const FetchOptions& options = {}) override;
  Status Delete(EntryId id) override;
  // As Client::List: ns nullopt lists every namespace on the admin socket,
  // the connection's own on a tenant one.
  Result<ListPage> List(const ListOptions& options) override;
  Result<StoreStats> Stat() override;
  Status SetByteBudget(std::uint64_t bytes) override;
  Result<StoreCheckReport> CheckStore(const CheckStoreOptions& options = {}) override;
  Status Compact() override;

  // The client for namespace `ns`: this one, or one connected for it.
  Result<std::shared_ptr<Client>> ClientFor(std::string_view ns);

 private:
  ClientOptions options_;
  std::shared_ptr<Client> client_;
};

}  // namespace primecache::client
