# primecache wire protocol, version 1.
#
# Every message on the socket is one standard, unpacked Cap'n Proto message in
# Cap'n Proto's own stream framing (segment table, then segments). A client
# sends `Request` messages; the daemon sends `Response` messages. Each request
# carries an id chosen by the client; every response names the id it answers,
# so a client may keep many requests in flight (pipelining). docs/protocol.md
# describes the rules: ordering, limits, the shared-memory handshake, errors.
@0xc51a35e972f8f6d5;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("primecache::wire");

const protocolVersion :UInt32 = 1;

# The identity of a model: a 128-bit digest of architecture, state-plan
# geometry, weights and codec versions, plus a readable name.
struct Fingerprint {
  digestLo @0 :UInt64;
  digestHi @1 :UInt64;
  name @2 :Text;
  # The canonical fingerprint encoding whose XXH3-128 is the digest (at most
  # 64 KiB; may be empty). Given with a publish, it is checked against the
  # digest and stored, so the entry can later be exported whole.
  descriptor @3 :Data;
}

# One prime boundary: which model, which tenant, the exact tokens.
struct Boundary {
  fingerprint @0 :Fingerprint;
  namespace @1 :Text;
  tokens @2 :List(UInt32);
  # The boundary length in tokens; equals tokens.length for a publish.
  length @3 :UInt32;
}

# Bytes placed in the connection's shared-memory region.
struct ShmRef {
  offset @0 :UInt64;
  length @1 :UInt64;
}

# Chunk bytes: carried in the message, or placed in the shared region.
struct Payload {
  union {
    inline @0 :Data;
    shm @1 :ShmRef;
    # In the connection's attached device window (attachDevice): the daemon
    # copied the bytes there with the GPU's copy engines.
    device @2 :DeviceRef;
  }
}

# Bytes in the connection's attached device window (attachDevice).
struct DeviceRef {
  offset @0 :UInt64;
  length @1 :UInt64;
}

enum ErrorCode {
  internal @0;
  invalidArgument @1;
  notFound @2;
  corruption @3;
  ioError @4;
  resourceExhausted @5;
  failedPrecondition @6;
  unavailable @7;
  alreadyExists @8;
  aborted @9;
  deadlineExceeded @10;
  notSupported @11;
  permissionDenied @12;
  # The message could not be read: framing, limits, nesting, unknown union
  # member, a request sent before hello.
  protocol @13;
}

struct Error {
  code @0 :ErrorCode;
  message @1 :Text;
}

struct Request {
  # Chosen by the client; echoed in every response to this request. Id 0 is
  # reserved for messages that expect no response (shmRelease).
  id @0 :UInt64;
  union {
    hello @1 :Hello;
    publishBegin @2 :PublishBegin;
    publishLayer @3 :PublishLayer;
    publishChunk @4 :PublishChunk;
    publishCommit @5 :PublishRef;
    publishAbort @6 :PublishRef;
    lookup @7 :Lookup;
    fetch @8 :Fetch;
    delete @9 :EntryRef;
    list @10 :ListRequest;
    stat @11 :Void;
    checkEntry @12 :EntryRef;
    shmAttach @13 :ShmAttach;
    shmRelease @14 :ShmRef;
    setByteBudget @15 :SetByteBudget;
    cancel @16 :Cancel;
    describe @17 :Describe;
    checkStore @18 :CheckStore;
    compact @19 :Void;
    attachDevice @20 :AttachDevice;
    # The client is done with a fetched chunk's bytes in the device window
    # (id 0, no response), like shmRelease for the shared region.
    deviceRelease @21 :DeviceRef;
  }
}

# The first request on a connection. The daemon picks the highest version in
# both [minVersion, maxVersion] and its own range, or answers notSupported.
struct Hello {
  minVersion @0 :UInt32;
  maxVersion @1 :UInt32;
  client @2 :Text;
  # The tenant this connection acts for. Every boundary and entry the
  # connection names must belong to it. Empty: the default namespace "".
  namespace @3 :Text;
  # This connection is rank tpRank of a tensor-parallel engine, whose
  # fetches the daemon's metrics count by rank (primecache_rank_fetch_bytes_total);
  # below 1024. The default: not a rank.
  tpRank @4 :UInt32 = 0xffffffff;
}

struct HelloReply {
  version @0 :UInt32;
  server @1 :Text;
  maxMessageBytes @2 :UInt64;
  maxChunkBytes @3 :UInt64;
  maxPublishesInFlight @4 :UInt32;
  admin @5 :Bool;
  # The daemon copies raw chunks into device memory an engine exports to it
  # (attachDevice); false: attachDevice is answered notSupported.
  deviceCopies @6 :Bool;
  # The daemon serves Fetch.query (false: an older daemon, which would
  # fetch entry 0 instead).
  fetchByQuery @7 :Bool;
  # The daemon takes PublishBegin.group (false: an older daemon, which
  # would store each rank's part as an entry of its own).
  groupPublish @8 :Bool;
}

# Opens a publish. Later publish messages name it by this request's id.
struct PublishBegin {
  boundary @0 :Boundary;
  layerCount @1 :UInt32;
  # What a prefill of the model costs (ModelCost in entry.h), for the
  # utility and marginal eviction policies; absent or all zero: unknown
  # (the boundary's tokens are weighed). An older client sends none.
  cost @2 :PrefillCost;
  # Set: this publish is one rank's part of a tensor-parallel entry
  # (docs/design-tensor-parallel.md); absent: an entry of its own.
  group @3 :PublishGroup;
}

# One rank's part of a group publish (PublishGroup in the store interface):
# the ranks of one group publish one identity under one token.
struct PublishGroup {
  token @0 :UInt64;  # not 0
  ranks @1 :UInt32;  # 2..1024
  rank @2 :UInt32;   # < ranks
}

struct PrefillCost {
  flopsPerToken @0 :UInt64;          # at most 2^50
  attentionLayers @1 :UInt32;        # at most the layer count
  attentionFlopsPerPair @2 :UInt64;  # at most 2^40
}

# Starts the next layer of an open publish: its encoded header bytes.
struct PublishLayer {
  publish @0 :UInt64;
  layer @1 :UInt32;
  header @2 :Data;
  chunkCount @3 :UInt32;
}

# One chunk of the current layer.
struct PublishChunk {
  publish @0 :UInt64;
  layer @1 :UInt32;
  index @2 :UInt32;
  data @3 :Payload;
}

struct PublishRef {
  publish @0 :UInt64;
}

struct Published {
  entry @0 :UInt64;
  # The boundary was stored already; the bytes sent were not written again.
  existed @1 :Bool;
  # Chunk bytes the publish added, chunk bytes it shares with entries stored
  # before, and entries evicted to make room.
  newChunkBytes @2 :UInt64;
  sharedChunkBytes @3 :UInt64;
  evicted @4 :UInt64;
  # A group part: durable, waiting for the other ranks' parts; the entry is
  # written (and `entry` set) when the last one commits.
  groupPending @5 :Bool;
}

# Admin: changes the store's byte budget (0: unlimited) and evicts down to it.
struct SetByteBudget {
  bytes @0 :UInt64;
}

struct Lookup {
  # fingerprint, namespace and the query tokens; length is ignored.
  query @0 :Boundary;
  # Also answer LookupReply.sharedTokens (the branch point). An older
  # daemon ignores it and answers 0.
  wantShared @1 :Bool;
}

struct EntryInfo {
  entry @0 :UInt64;
  boundary @1 :Boundary;
  layerCount @2 :UInt32;
  bytes @3 :UInt64;
  rawBytes @4 :UInt64;
  createdUnixMs @5 :UInt64;
  # The store's logical access clock: larger is more recent.
  lastAccess @6 :UInt64;
  hits @7 :UInt64;
  # A quarantined entry failed a check and is never served; reason says why.
  # Its tokens are not kept (boundary.tokens is empty; length is right).
  quarantined @8 :Bool;
  reason @9 :Text;
  # The entry's manifest, tokens and records, and the prefill compute a hit
  # saves (estimated FLOPs).
  metaBytes @10 :UInt64;
  flops @11 :Float64;
  # A tensor-parallel entry's parts (0 from an older daemon: 1).
  ranks @12 :UInt32;
}

struct LookupReply {
  found @0 :Bool;
  # Matched boundary length; the entry's tokens are the query's first `length`.
  length @1 :UInt32;
  entry @2 :UInt64;
  layerCount @3 :UInt32;
  # Stored (encoded) chunk bytes and decoded bytes of the entry's layers:
  # what a restore sizes itself by.
  bytes @4 :UInt64;
  rawBytes @5 :UInt64;
  # With Lookup.wantShared: the longest prefix of the query that a stored
  # entry of the same model and namespace shares token for token, boundary
  # there or not (at least `length`; 0 when none). Set on a miss too.
  sharedTokens @6 :UInt32;
  # A tensor-parallel entry's parts (0 from an older daemon: 1).
  ranks @7 :UInt32;
}

struct Fetch {
  entry @0 :UInt64;
  # Layer indices to stream, in this order; empty means every layer.
  layers @1 :List(UInt32);
  # Deliver chunk bytes through the shared region inside this window (a ring);
  # absent (length 0) means inline in the messages.
  shmWindow @2 :ShmRef;
  # Copy chunks stored raw into this sub-range of the attached device window
  # (a ring, used like shmWindow); absent (length 0): no device copies.
  deviceWindow @3 :DeviceRef;
  # The client takes extents: a fetchChunk in a window may carry a run of
  # adjacent chunks of one layer (FetchChunk.count). False (an older
  # client): one chunk per fetchChunk.
  extents @4 :Bool;
  # Set: fetch the longest stored prefix of this query instead of `entry`
  # (one round trip where lookup then fetch take two). The daemon looks it
  # up as `lookup` does, leases the hit and streams it; the stream begins
  # with one fetchHit, and after a miss (found false) only fetchDone follows.
  # Only to a daemon whose hello says fetchByQuery.
  query @5 :Lookup;
  # With query: a hit that is a tensor-parallel entry (ranks > 1) streams no
  # layers, only fetchHit and then fetchDone; each rank fetches its own
  # head-group parts by entry instead. False (an older client): every hit
  # streams whole.
  skipPartedHits @6 :Bool;
}

# Streamed answers to a fetch, in order: for each layer a FetchLayer, then its
# chunks, and finally fetchDone (or an error, which ends the stream).
struct FetchLayer {
  layer @0 :UInt32;
  header @1 :Data;
  chunkCount @2 :UInt32;
}

struct FetchChunk {
  layer @0 :UInt32;
  index @1 :UInt32;
  data @2 :Payload;
  # An extent (only to a client that asked for them, only in the shared or
  # the device window): chunks index .. index+count-1 of `layer`, back to
  # back at data's offset, each `sizes[i]` bytes, data's length in all; one
  # release (shmRelease / deviceRelease of data's offset and length) for
  # the whole extent. 0 (an older daemon, no sizes) or 1: one chunk.
  count @3 :UInt32;
  sizes @4 :List(UInt64);
}

struct FetchDone {
  layers @0 :UInt32;
  bytes @1 :UInt64;
}

struct EntryRef {
  entry @0 :UInt64;
}

struct ListRequest {
  # Filters: a zero digest means any model. Entries of the connection's own
  # namespace only, unless allNamespaces is set on an admin connection.
  digestLo @0 :UInt64;
  digestHi @1 :UInt64;
  # Opaque, from the previous page; empty starts from the beginning.
  pageToken @2 :Data;
  pageSize @3 :UInt32;
  allNamespaces @4 :Bool;
  # Admin only: list quarantined entries instead of live ones.
  quarantined @5 :Bool;
  # Leave every entry's tokens out (boundary.length still says how many).
  omitTokens @6 :Bool;
}

struct ListReply {
  entries @0 :List(EntryInfo);
  # Empty when there are no more pages. A page may hold fewer than pageSize
  # entries (even none) while more follow: continue until this is empty.
  nextPageToken @1 :Data;
}

struct StatReply {
  entries @0 :UInt64;
  bytesStored @1 :UInt64;
  bytesRaw @2 :UInt64;
  hits @3 :UInt64;
  misses @4 :UInt64;
  evictions @5 :UInt64;
  connections @6 :UInt32;
  publishesInFlight @7 :UInt32;
  byteBudget @8 :UInt64;
  quarantined @9 :UInt64;
  # Distinct chunks, and what the entries would take without sharing them.
  chunks @10 :UInt64;
  bytesLogical @11 :UInt64;
  dedupSavedBytes @12 :UInt64;
  admissionRefusals @13 :UInt64;
  activeLeases @14 :UInt64;
  # Every file of the store directory: tables, blob files, the log.
  diskBytes @15 :UInt64;
  # Header and chunk bytes of publishes begun and not yet committed or
  # aborted, over every connection (bounded by --max-uncommitted-total).
  uncommittedBytes @16 :UInt64;
  # Chunk bytes the store holds for publishes not committed yet.
  stagedBytes @17 :UInt64;
  # Set while the store refuses writes after a failed one (a full disk): why.
  writeError @18 :Text;
  # The remote tier's counters since the daemon started; absent when the
  # daemon runs without one (--remote). A reader of an older schema skips it.
  remote @19 :RemoteTierStats;
  # Times a fetch waited for its client to release room in its shared or
  # device window since the daemon started (a slow reader, or a small window).
  fetchWindowWaits @20 :UInt64;
  # Group publishes (tensor-parallel entries) begun and neither written nor
  # aborted, and those aborted since the daemon started.
  groupPublishesOpen @21 :UInt64;
  groupPublishesAborted @22 :UInt64;
  # Memory the store's RocksDB holds: its block cache (in use, capacity),
  # its memtables, and its table readers' indexes and filters.
  blockCacheUsedBytes @23 :UInt64;
  blockCacheCapacityBytes @24 :UInt64;
  memtableBytes @25 :UInt64;
  tableReaderBytes @26 :UInt64;
  # The daemon process: resident set; the allocator's bytes in use and
  # freed but kept.
  rssBytes @27 :UInt64;
  heapInUseBytes @28 :UInt64;
  heapFreeBytes @29 :UInt64;
}

# The shared tier on a Redis Cluster (docs/cluster.md), as one daemon saw it.
struct RemoteTierStats {
  # Lookups the local store could not cover whole that the cluster extended
  # (the entry fetched, checked and kept locally), could not extend, or failed
  # at (the lookup then answered from the local store alone).
  hits @0 :UInt64;
  misses @1 :UInt64;
  errors @2 :UInt64;
  # Chunk bytes brought from the cluster.
  fetchedBytes @3 :UInt64;
  # Write-behind: entries queued, written to the cluster, and dropped because
  # the queue was full; chunk bytes written; entries waiting or being
  # written now.
  queued @4 :UInt64;
  put @5 :UInt64;
  dropped @6 :UInt64;
  putBytes @7 :UInt64;
  queueDepth @8 :UInt64;
  # Remote entries found evicted (a chunk or the manifest gone) or damaged
  # (a check failed); either is a miss and is removed from the cluster.
  evicted @9 :UInt64;
  damaged @10 :UInt64;
  # The cluster client's circuit breaker: open now, times opened, commands
  # refused while open; MOVED and ASK redirections followed.
  breakerOpen @11 :Bool;
  breakerOpens @12 :UInt64;
  fastFailures @13 :UInt64;
  moved @14 :UInt64;
  asked @15 :UInt64;
  # Lookups not asked of the cluster because the same query missed there
  # within the daemon's --remote-miss-ttl (a negative cache).
  missesCached @16 :UInt64;
  # Remote entries whose chunks matched their addresses but whose layers the
  # local checks refused (not decodable to what their headers declare, or
  # not their model's plan): a miss, removed from the cluster, not kept.
  refused @17 :UInt64;
}

# One entry in full: what List gives, and, when asked, every layer's
# serialized header (kind, shape, transforms, chunk sizes and checksums)
# without the chunk bytes. A quarantined entry is described only on the
# admin socket, without tokens or headers.
struct Describe {
  entry @0 :UInt64;
  layerHeaders @1 :Bool;
}

struct DescribeReply {
  info @0 :EntryInfo;
  layerHeaders @1 :List(Data);
}

# Admin: cross-checks everything the store records (manifests against chunk
# reference counts, the index, recency records, counters); with readChunks,
# every chunk's bytes against its address too.
struct CheckStore {
  readChunks @0 :Bool;
}

struct StoreCheckReport {
  entries @0 :UInt64;
  chunks @1 :UInt64;
  # Empty: consistent. At most 1000 are sent; problemCount has them all.
  problems @2 :List(Text);
  problemCount @3 :UInt64;
}

struct CheckEntryReply {
  ok @0 :Bool;
  message @1 :Text;
  layers @2 :UInt32;
  bytes @3 :UInt64;
}

# Announces the shared-memory region: the memfd travels in the same sendmsg
# as this message's first byte, as SCM_RIGHTS ancillary data.
struct ShmAttach {
  size @0 :UInt64;
}

# Names device memory the engine exported (cudaIpcGetMemHandle) for the
# daemon to copy fetched chunks into: one window per connection; a second
# attach replaces the first (fetches running keep the one they started with).
struct AttachDevice {
  # The device, as cudaDeviceGetPCIBusId writes it.
  pciBusId @0 :Text;
  # The cudaIpcMemHandle_t bytes (64).
  handle @1 :Data;
  # Bytes of the exported allocation the daemon may write, from its start.
  size @2 :UInt64;
}

struct Cancel {
  # The id of the fetch to stop.
  target @0 :UInt64;
}

struct Response {
  id @0 :UInt64;
  union {
    error @1 :Error;
    hello @2 :HelloReply;
    ack @3 :Void;
    published @4 :Published;
    lookup @5 :LookupReply;
    fetchLayer @6 :FetchLayer;
    fetchChunk @7 :FetchChunk;
    fetchDone @8 :FetchDone;
    list @9 :ListReply;
    stat @10 :StatReply;
    checkEntry @11 :CheckEntryReply;
    describe @12 :DescribeReply;
    storeCheckReport @13 :StoreCheckReport;
    # Streamed, first, to a fetch by query (Fetch.query): what the lookup found.
    fetchHit @14 :LookupReply;
  }
}
