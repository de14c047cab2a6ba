// The primecache client library: what an inference engine links to talk to
// the daemon `primecached` over its Unix socket (or loopback TCP).
//
// Calls are synchronous (returning Status / Result) or asynchronous (returning
// std::future of the same). Every call has a deadline (ClientOptions::timeout);
// a missed deadline is kDeadlineExceeded. Requests are pipelined on one
// connection: many may be in flight from many threads at once.
//
// Everything here is in namespace primecache::client, except the values that
// describe entries (EntryInfo, EntryDetail, ListPage, LookupHit, DaemonStats,
// StoreCheckReport, PublishResult: primecache/entry.h), which are the store's
// own, passed through unchanged.
//
// Errors are typed by StatusCode: kNotFound (no such entry or publish),
// kInvalidArgument (a bad request; a message starting "protocol: " means the
// daemon could not read it), kFailedPrecondition (a message starting
// "permission denied: " means the operation needs the admin socket or another
// namespace), kResourceExhausted (a limit, e.g. publishes in flight),
// kCorruption (stored bytes failed their checksum), kUnavailable (no daemon, or
// the connection dropped), kDeadlineExceeded, kNotSupported (no common
// protocol version).
//
// Reconnection: when the connection drops (daemon restart), calls in flight
// fail with kUnavailable and the next call reconnects (up to
// reconnect_attempts tries, reconnect_backoff apart), redoing the hello and
// the shared-memory handshake. Idempotent calls (Lookup, Fetch, List, Stat,
// Verify, Describe) are retried once on a fresh connection; a publish is not (its
// stream was lost with the connection; the daemon aborted it).
//
// Shared memory: with ClientOptions::shared_memory the client creates a memfd
// region, maps it and passes it to the daemon. Its first half carries publish
// chunks (PublishStream::ReserveChunk lets an encoder write a chunk there in
// place; AddChunk copies it there), its second half is the fetch window that
// fetched chunks arrive in; only offsets cross the socket. region()
// exposes it so an engine can register it as pinned memory
// (cudaHostRegister(region().base, region().size, ...)) and copy straight from
// the bytes a FetchCallbacks::on_chunk sees.
//
// Device copies: an engine may export device memory to the daemon
// (AttachDeviceWindow) so that the daemon's GPU copy engines write chunks
// stored raw straight into it from the page cache (on_device_extent), with no
// CPU copy of their bytes. docs/protocol.md, "Device copies".
//
// Thread-safety: a Client may be used from many threads at once. Callbacks
// run on the client's reader thread; they must not call the Client.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/entry.h"
#include "primecache/status.h"

namespace primecache::client {

struct ClientOptions {
  // "/path/to.sock", or "tcp:127.0.0.1:PORT" (no shared memory over TCP).
  std::string endpoint;
  std::string client_name = "primecache-client";
  std::string ns;  // the tenant namespace this client acts for
  std::chrono::milliseconds timeout{10000};
  std::chrono::milliseconds connect_timeout{2000};
  int reconnect_attempts = 20;
  std::chrono::milliseconds reconnect_backoff{50};
  bool shared_memory = false;
  std::size_t shared_memory_bytes = 64u << 20;  // half for publishing, half for fetching
  // This client is rank tp_rank (below 1024) of a tensor-parallel engine:
  // the daemon's metrics count its fetched bytes by rank.
  std::optional<std::uint32_t> tp_rank;
};

struct ModelId {
  Hash128 digest;    // architecture, geometry, weights, codec versions
  std::string name;  // readable
  // The canonical fingerprint encoding (EncodeFingerprint in
  // primecache/internal/snapshot.h) whose Checksum128 is `digest`; may be empty. Sent
  // with a publish, it lets the entry be exported whole later.
  std::string descriptor;
  // What a prefill of the model costs; sent with every publish so that the
  // daemon's utility and marginal policies weigh a boundary by the compute
  // it saves (zero: unknown, its tokens are weighed).
  ModelCost cost;
};

// One encoded layer: its serialized header (SerializeLayerHeader) and its
// chunks' bytes, as the codecs make them.
struct LayerData {
  std::vector<std::byte> header;
  std::vector<std::vector<std::byte>> chunks;
};

// Ends a held chunk's loan (FetchCallbacks::on_chunk_held). Call it exactly
// once, from any thread; later calls do nothing.
using ChunkRelease = std::function<void()>;

// Adjacent chunks of one layer that the daemon copied into the device window
// back to back (FetchCallbacks::on_device_extent): chunks index ..
// index+count-1 of `layer`, `length` bytes at `offset` of the window, chunk
// index+i being sizes[i] bytes of them. The client checked that they lie
// inside the window, that the chunks are of the layer announced last and
// within its chunk count, and that the sizes add up to `length`; what the
// sizes should be only the layer's header says, so the callback checks each
// against it. `sizes` is valid only during the call.
struct DeviceExtent {
  std::uint32_t layer = 0;
  std::uint32_t index = 0;
  std::uint32_t count = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::span<const std::uint64_t> sizes;
};

struct FetchCallbacks {
  std::function<Status(std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunk_count)> on_layer;
  // `bytes` is valid only during the call; with shared memory it lies inside
  // region(). A non-OK return cancels the fetch and becomes its result.
  std::function<Status(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes)> on_chunk;
  // Instead of on_chunk (which is then not called): the chunk is handed over,
  // its bytes valid until `release` is called, while the fetch goes on
  // streaming; so an engine decodes chunks on threads of its own as the next
  // ones arrive. Every release received must be called: with shared memory
  // the daemon reuses window space only after it (in arrival order), and a
  // fetch whose window fills up waits. Fetch returns when every chunk has been
  // handed over, not when they are released.
  std::function<Status(std::uint32_t layer, std::uint32_t index, std::span<const std::byte> bytes,
                       ChunkRelease release)>
      on_chunk_held;
  // Chunks stored raw that the daemon copied into the attached device window
  // (AttachDeviceWindow), adjacent chunks of one layer back to back as one
  // extent (DeviceExtent), on the device once this is called. The extent's
  // window space is lent until `release` is called (exactly once, from any
  // thread, e.g. after the engine's own copies out of it finished); the
  // daemon reuses it in arrival order only after that, and a fetch whose
  // device ring is full waits. The fetch uses the device window only when
  // this is set and a window is attached; other chunks still come through
  // on_chunk / on_chunk_held (one call each, also when the daemon sent
  // several in one message).
  std::function<Status(const DeviceExtent& extent, ChunkRelease release)> on_device_extent;
  // LookupAndFetch only: the hit it is about to stream, before its first
  // layer (not called on a miss). A non-OK return cancels the fetch and
  // becomes its result.
  std::function<Status(const LookupHit& hit)> on_hit;
  // LookupAndFetch only: a hit that is a tensor-parallel entry
  // (LookupHit::ranks > 1) streams nothing; it is told to on_hit and
  // returned, and its head-group parts are the caller's to fetch by entry
  // (the daemon then reads and counts only those bytes).
  bool skip_parted_hits = false;
};

struct FetchedLayer {
  std::uint32_t layer = 0;
  LayerData data;
};

using primecache::DaemonStats;
using primecache::DescribeOptions;
using primecache::EntryCheckReport;
using primecache::EntryDetail;
using primecache::EntryInfo;
using primecache::ListOptions;
using primecache::ListPage;
using primecache::LookupHit;
using primecache::PublishResult;
using primecache::StoreCheckReport;

struct ServerInfo {
  std::uint32_t version = 0;
  std::string server;
  std::uint64_t max_message_bytes = 0;
  std::uint64_t max_chunk_bytes = 0;
  std::uint32_t max_publishes_in_flight = 0;
  bool admin = false;
  // The daemon copies raw chunks into device memory the engine exports to it
  // (AttachDeviceWindow); false: an attach is refused with kNotSupported.
  bool device_copies = false;
  // The daemon fetches by query in one round trip (LookupAndFetch); false:
  // LookupAndFetch makes a lookup, then a fetch.
  bool fetch_by_query = false;
  // The daemon takes group publishes (PublishGroup); false: BeginPublish
  // with a group is refused with kNotSupported (an older daemon would store
  // each rank's part as an entry of its own).
  bool group_publish = false;
};

// The bytes of a CUDA IPC handle (cudaIpcMemHandle_t).
inline constexpr std::size_t kDeviceHandleBytes = 64;

// Device memory an engine exports to the daemon for it to copy fetched raw
// chunks into (Client::AttachDeviceWindow): one whole cudaMalloc allocation
// (IPC handles name allocations).
struct DeviceWindowSpec {
  std::string pci_bus_id;  // the device, as cudaDeviceGetPCIBusId writes it
  std::string handle;      // the cudaIpcMemHandle_t bytes (kDeviceHandleBytes)
  std::uint64_t size = 0;  // bytes from the allocation's start the daemon may write
};

struct SharedRegion {
  void* base = nullptr;
  std::size_t size = 0;
  int fd = -1;
};

class Client;

// Space for one chunk that an encoder writes in place (PublishStream::
// ReserveChunk), then hands over with PublishStream::AddReservedChunk. With
// shared memory it lies in the publish half of region(), so the chunk is
// written once on the host and only its offset crosses the socket; without
// shared memory (TCP) it is a private buffer sent inline. Move-only; one that
// is destroyed without being added gives its space back. Its bytes may be
// written from any thread; it may outlive its stream and its Client.
class ReservedChunk {
 public:
  ReservedChunk() = default;
  ~ReservedChunk();
  ReservedChunk(ReservedChunk&& other) noexcept;
  ReservedChunk& operator=(ReservedChunk&& other) noexcept;
  ReservedChunk(const ReservedChunk&) = delete;
  ReservedChunk& operator=(const ReservedChunk&) = delete;

  // The reserved bytes (empty for a default-constructed or added chunk).
  std::span<std::byte> bytes() const { return bytes_; }
  std::size_t size() const { return bytes_.size(); }
  // True when the bytes lie in the shared region.
  bool in_shared_memory() const { return space_ != nullptr; }

  struct Space;  // internal: the publish half's allocator

 private:
  friend class PublishStream;
  void GiveBack();
  std::shared_ptr<Space> space_;  // null: a private buffer (own_)
  std::unique_ptr<std::byte[]> own_;
  std::span<std::byte> bytes_;
  std::uint64_t offset_ = 0;    // in the region
  std::uint64_t reserved_ = 0;  // bytes taken from the allocator (bytes_ rounded up)
};

// A publish being streamed: layers in order, each a header then its chunks,
// then Commit (or Abort). Chunks are pipelined: AddChunk returns once the
// chunk is sent, not when it is stored. Destroying an uncommitted stream
// aborts it. One thread at a time.
class PublishStream {
 public:
  ~PublishStream();
  PublishStream(const PublishStream&) = delete;
  PublishStream& operator=(const PublishStream&) = delete;

  Status BeginLayer(std::span<const std::byte> header, std::uint32_t chunk_count);
  // Sends the next chunk of the current layer. With shared memory it is
  // copied into the region (one copy; ReserveChunk avoids it); a chunk larger
  // than the publish half of the region travels inline.
  Status AddChunk(std::span<const std::byte> bytes);

  // Space for a chunk of up to `size` bytes (1..max_chunk_bytes), for an
  // encoder to write the chunk in place. Several may be held at once and
  // filled on other threads; each is added (in chunk order) or dropped.
  // With shared memory the space comes from the publish half of region(),
  // shared by every stream of the Client and given back when the daemon has
  // stored the chunk; when it is full this waits (up to
  // ClientOptions::timeout, then kDeadlineExceeded) for chunks to be
  // stored or reservations dropped. kInvalidArgument: `size` is 0, over the
  // daemon's max_chunk_bytes, or over the publish half of the region.
  Result<ReservedChunk> ReserveChunk(std::size_t size);
  // Sends the first `length` bytes of `chunk` (length <= chunk.size(); the
  // rest is given back at once) as the next chunk of the current layer. The
  // bytes must not change until the stream commits or aborts; the space is
  // reused once the daemon has stored them.
  Status AddReservedChunk(ReservedChunk chunk, std::size_t length);
  Status AddReservedChunk(ReservedChunk chunk) {
    const std::size_t n = chunk.size();
    return AddReservedChunk(std::move(chunk), n);
  }
  Result<PublishResult> Commit();
  Status Abort();

  struct State;

 private:
  friend class Client;
  explicit PublishStream(std::unique_ptr<State> st);
  std::unique_ptr<State> st_;
};

class Client {
 public:
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Connects and says hello (and attaches shared memory when asked).
  static Result<std::unique_ptr<Client>> Connect(ClientOptions options);

  const ServerInfo& server_info() const;
  // The shared region (base null without shared memory).
  SharedRegion region() const;
  // Hands the daemon device memory to copy fetched raw chunks into (see
  // FetchCallbacks::on_device_extent); attached again after a reconnect. One
  // window per client: a later attach replaces it (fetches streaming keep
  // the old one). kNotSupported: the daemon makes no device copies
  // (ServerInfo::device_copies) or the connection is TCP; kInvalidArgument:
  // the daemon refused the handle (its size, the device, the allocation).
  Status AttachDeviceWindow(const DeviceWindowSpec& spec);
  // True while a connection is up.
  bool connected() const;

  // The longest stored boundary that prefixes `tokens` (nullopt: a miss),
  // with the layer count and sizes a restore needs. `shared_tokens`, when not
  // null, receives the query's shared length, its branch point: the longest
  // prefix of `tokens` that a stored entry of this model and namespace
  // shares token for token, boundary there or not (at least the hit's
  // length; 0 when none). An engine that captures its state there makes the
  // prefix a boundary for the next request that shares it.
  Result<std::optional<LookupHit>> Lookup(const ModelId& model, std::span<const std::uint32_t> tokens,
                                          std::uint64_t* shared_tokens);
  // Without the shared length (the daemon then does not look for it).
  Result<std::optional<LookupHit>> Lookup(const ModelId& model, std::span<const std::uint32_t> tokens);
  // With `group`: this stream is one rank's part of a tensor-parallel entry
  // (PublishGroup, primecache/entry.h); its Commit answers group_pending
  // until the last rank's part commits.
  Result<std::unique_ptr<PublishStream>> BeginPublish(const ModelId& model, std::span<const std::uint32_t> tokens,
                                                      std::uint32_t layer_count,
                                                      const std::optional<PublishGroup>& group = std::nullopt);
  // Streams every layer and commits.
  Result<PublishResult> Publish(const ModelId& model, std::span<const std::uint32_t> tokens,
                                const std::vector<LayerData>& layers);
  // Streams the entry's layers (empty: all) through the callbacks.
  Status Fetch(std::uint64_t entry, std::span<const std::uint32_t> layers, const FetchCallbacks& cb);
  // Lookup and Fetch of every layer of the hit in one round trip (the
  // daemon leases the hit between the two): the hit (nullopt: a miss, and
  // nothing streamed), told to cb.on_hit before its first layer;
  // `shared_tokens` as Lookup's. With a daemon that does not fetch by query
  // (ServerInfo::fetch_by_query) it makes the two calls.
  Result<std::optional<LookupHit>> LookupAndFetch(const ModelId& model, std::span<const std::uint32_t> tokens,
                                                  const FetchCallbacks& cb, std::uint64_t* shared_tokens = nullptr);
  Result<std::vector<FetchedLayer>> FetchLayers(std::uint64_t entry, std::span<const std::uint32_t> layers = {});
  // A page of entries (ListOptions: limit is the page size). ns nullopt: the
  // connection's own namespace on a tenant connection, every namespace on
  // the admin socket; another namespace than the connection's asks for every
  // namespace (admin socket only) and keeps that one's (the page may then
  // come back short while more follow); kQuarantined: admin socket only.
  Result<ListPage> List(const ListOptions& options = {});
  Result<DaemonStats> Stat();
  Result<EntryCheckReport> CheckEntry(std::uint64_t entry);
  // One entry; with layer_headers, every layer's header too (no chunk bytes).
  // Quarantined entries are described on the admin socket only; with ns,
  // only a live entry of that namespace (any other: kNotFound).
  Result<EntryDetail> Describe(std::uint64_t entry, const DescribeOptions& options = {});
  // Admin socket only. SetByteBudget changes the store's byte budget (0:
  // unlimited) and evicts down to it. CheckStore cross-checks the store's
  // records (and with read_chunks every chunk's bytes); Compact reclaims the
  // space of deleted entries. Both can take long: mind ClientOptions::timeout.
  Status Delete(std::uint64_t entry);
  Status SetByteBudget(std::uint64_t bytes);
  Result<StoreCheckReport> CheckStore(bool read_chunks);
  Status Compact();

  // Asynchronous forms: the same work, finished on the client's threads.
  std::future<Result<std::optional<LookupHit>>> LookupAsync(const ModelId& model, std::vector<std::uint32_t> tokens);
  std::future<Result<PublishResult>> PublishAsync(const ModelId& model, std::vector<std::uint32_t> tokens,
                                                  std::vector<LayerData> layers);
  std::future<Result<std::vector<FetchedLayer>>> FetchLayersAsync(std::uint64_t entry,
                                                                  std::vector<std::uint32_t> layers = {});
  std::future<Result<DaemonStats>> StatAsync();

  struct Impl;

 private:
  explicit Client(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace primecache::client
