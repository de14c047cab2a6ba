// Between the project's value types and their Cap'n Proto messages
// (ipc/primecache.capnp). Each Write/Read pair copies a message's fields one by
// one: the pairs are alike in shape, but each names its own schema fields, and
// a field left out of one side would be a silent protocol bug that the
// round-trip tests catch per message.
#include "ipc/wire.h"

#include <algorithm>
#include <string>

namespace primecache::ipc {

wire::ErrorCode ToWireCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
    case StatusCode::kInternal: return wire::ErrorCode::INTERNAL;
    case StatusCode::kInvalidArgument: return wire::ErrorCode::INVALID_ARGUMENT;
    case StatusCode::kNotFound: return wire::ErrorCode::NOT_FOUND;
    case StatusCode::kCorruption: return wire::ErrorCode::CORRUPTION;
    case StatusCode::kIOError: return wire::ErrorCode::IO_ERROR;
    case StatusCode::kResourceExhausted: return wire::ErrorCode::RESOURCE_EXHAUSTED;
    case StatusCode::kFailedPrecondition: return wire::ErrorCode::FAILED_PRECONDITION;
    case StatusCode::kUnavailable: return wire::ErrorCode::UNAVAILABLE;
    case StatusCode::kAlreadyExists: return wire::ErrorCode::ALREADY_EXISTS;
    case StatusCode::kAborted: return wire::ErrorCode::ABORTED;
    case StatusCode::kDeadlineExceeded: return wire::ErrorCode::DEADLINE_EXCEEDED;
    case StatusCode::kNotSupported: return wire::ErrorCode::NOT_SUPPORTED;
  }
  return wire::ErrorCode::INTERNAL;
}

Status FromWireError(wire::ErrorCode code, std::string message) {
  switch (code) {
    case wire::ErrorCode::INTERNAL: return Status::Internal(std::move(message));
    case wire::ErrorCode::INVALID_ARGUMENT: return Status::InvalidArgument(std::move(message));
    case wire::ErrorCode::NOT_FOUND: return Status::NotFound(std::move(message));
    case wire::ErrorCode::CORRUPTION: return Status::Corruption(std::move(message));
    case wire::ErrorCode::IO_ERROR: return Status::IOError(std::move(message));
    case wire::ErrorCode::RESOURCE_EXHAUSTED: return Status::ResourceExhausted(std::move(message));
    case wire::ErrorCode::FAILED_PRECONDITION: return Status::FailedPrecondition(std::move(message));
    case wire::ErrorCode::UNAVAILABLE: return Status::Unavailable(std::move(message));
    case wire::ErrorCode::ALREADY_EXISTS: return Status::AlreadyExists(std::move(message));
    case wire::ErrorCode::ABORTED: return Status::Aborted(std::move(message));
    case wire::ErrorCode::DEADLINE_EXCEEDED: return Status::DeadlineExceeded(std::move(message));
    case wire::ErrorCode::NOT_SUPPORTED: return Status::NotSupported(std::move(message));
    case wire::ErrorCode::PERMISSION_DENIED: return Status::FailedPrecondition("permission denied: " + message);
    case wire::ErrorCode::PROTOCOL: return Status::InvalidArgument("protocol: " + message);
  }
  return Status::Internal("unknown error code " + std::to_string(static_cast<int>(code)) + ": " + message);
}

std::unique_ptr<OutMessage> ErrorResponse(std::uint64_t id, wire::ErrorCode code, const std::string& message) {
  return BuildResponse(id, [&](wire::Response::Builder r) {
    auto e = r.initError();
    e.setCode(code);
    e.setMessage(message);
  });
}

namespace {

kj::ArrayPtr<const kj::byte> KjBytes(std::string_view s) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}
std::string Str(capnp::Data::Reader d) { return {reinterpret_cast<const char*>(d.begin()), d.size()}; }
std::string Str(capnp::Text::Reader t) { return {t.cStr(), t.size()}; }

}  // namespace

void WritePublishResult(const PublishResult& p, wire::Published::Builder w) {
  w.setEntry(p.id);
  w.setExisted(p.existed);
  w.setNewChunkBytes(p.new_chunk_bytes);
  w.setSharedChunkBytes(p.shared_chunk_bytes);
  w.setEvicted(p.evicted);
  w.setGroupPending(p.group_pending);
}

PublishResult ReadPublishResult(wire::Published::Reader r) {
  return PublishResult{r.getEntry(),       r.getExisted(), r.getNewChunkBytes(), r.getSharedChunkBytes(),
                       r.getEvicted(),     r.getGroupPending()};
}

void WriteEntryInfo(const EntryInfo& e, wire::EntryInfo::Builder w) {
  w.setEntry(e.id);
  w.setLayerCount(e.layers);
  w.setRanks(e.ranks);
  w.setBytes(e.chunk_bytes);
  w.setRawBytes(e.raw_bytes);
  w.setMetaBytes(e.meta_bytes);
  w.setFlops(e.flops);
  w.setCreatedUnixMs(e.created_unix_ms);
  w.setLastAccess(e.last_access);
  w.setHits(e.hits);
  w.setQuarantined(e.quarantined());
  w.setReason(e.reason);
  auto b = w.initBoundary();
  b.setNamespace(e.ns);
  b.setLength(static_cast<std::uint32_t>(e.length != 0 ? e.length : e.tokens.size()));
  auto fp = b.initFingerprint();
  fp.setDigestLo(e.model.lo);
  fp.setDigestHi(e.model.hi);
  fp.setName(e.model_name);
  fp.setDescriptor(KjBytes(e.model_descriptor));
  auto t = b.initTokens(static_cast<unsigned>(e.tokens.size()));
  for (unsigned k = 0; k < t.size(); ++k) t.set(k, e.tokens[k]);
}

EntryInfo ReadEntryInfo(wire::EntryInfo::Reader r) {
  EntryInfo e;
  e.id = r.getEntry();
  e.state = r.getQuarantined() ? EntryState::kQuarantined : EntryState::kLive;
  auto b = r.getBoundary();
  auto fp = b.getFingerprint();
  e.model = {fp.getDigestLo(), fp.getDigestHi()};
  e.model_name = Str(fp.getName());
  e.model_descriptor = Str(fp.getDescriptor());
  e.ns = Str(b.getNamespace());
  e.length = b.getLength();
  e.tokens = ToVector(b.getTokens());
  e.layers = r.getLayerCount();
  e.ranks = std::max<std::uint32_t>(r.getRanks(), 1);
  e.chunk_bytes = r.getBytes();
  e.raw_bytes = r.getRawBytes();
  e.meta_bytes = r.getMetaBytes();
  e.flops = r.getFlops();
  e.created_unix_ms = r.getCreatedUnixMs();
  e.last_access = r.getLastAccess();
  e.hits = r.getHits();
  e.reason = Str(r.getReason());
  return e;
}

void WriteListPage(const ListPage& page, wire::ListReply::Builder w) {
  w.setNextPageToken(KjBytes(page.next_page_token));
  auto list = w.initEntries(static_cast<unsigned>(page.entries.size()));
  for (unsigned i = 0; i < list.size(); ++i) WriteEntryInfo(page.entries[i], list[i]);
}

ListPage ReadListPage(wire::ListReply::Reader r) {
  ListPage page;
  page.next_page_token = Str(r.getNextPageToken());
  page.entries.reserve(r.getEntries().size());
  for (auto e : r.getEntries()) page.entries.push_back(ReadEntryInfo(e));
  return page;
}

void WriteEntryDetail(const EntryDetail& d, wire::DescribeReply::Builder w) {
  WriteEntryInfo(d.info, w.initInfo());
  auto hs = w.initLayerHeaders(static_cast<unsigned>(d.layer_headers.size()));
  for (unsigned i = 0; i < hs.size(); ++i) hs.set(i, KjBytes(d.layer_headers[i]));
}

EntryDetail ReadEntryDetail(wire::DescribeReply::Reader r) {
  EntryDetail d;
  d.info = ReadEntryInfo(r.getInfo());
  for (auto h : r.getLayerHeaders()) d.layer_headers.push_back(Str(h));
  return d;
}

void WriteLookupHit(const std::optional<LookupHit>& hit, std::uint64_t shared_tokens,
                    wire::LookupReply::Builder w) {
  w.setSharedTokens(static_cast<std::uint32_t>(shared_tokens));
  if (!hit) return;
  w.setFound(true);
  w.setEntry(hit->id);
  w.setLength(static_cast<std::uint32_t>(hit->length));
  w.setLayerCount(hit->layers);
  w.setRanks(hit->ranks);
  w.setBytes(hit->chunk_bytes);
  w.setRawBytes(hit->raw_bytes);
}

Result<std::optional<LookupHit>> ReadLookupHit(wire::LookupReply::Reader r, std::size_t query_tokens) {
  if (!r.getFound()) return std::optional<LookupHit>();
  if (r.getLength() == 0 || r.getLength() > query_tokens) {
    return Status::Corruption("daemon's hit of " + std::to_string(r.getLength()) +
                              " tokens is no prefix of the query's " + std::to_string(query_tokens));
  }
  return std::optional<LookupHit>(LookupHit{r.getEntry(), r.getLength(), r.getLayerCount(),
                                            std::max<std::uint32_t>(r.getRanks(), 1), r.getBytes(),
                                            r.getRawBytes()});
}

namespace {

void WriteRemoteStats(const RemoteStats& s, wire::RemoteTierStats::Builder w) {
  w.setHits(s.hits);
  w.setMisses(s.misses);
  w.setErrors(s.errors);
  w.setFetchedBytes(s.fetched_bytes);
  w.setQueued(s.queued);
  w.setPut(s.put);
  w.setDropped(s.dropped);
  w.setPutBytes(s.put_bytes);
  w.setQueueDepth(s.queue_depth);
  w.setEvicted(s.evicted);
  w.setDamaged(s.damaged);
  w.setBreakerOpen(s.breaker_open);
  w.setBreakerOpens(s.breaker_opens);
  w.setFastFailures(s.fast_failures);
  w.setMoved(s.moved);
  w.setAsked(s.asked);
  w.setMissesCached(s.misses_cached);
  w.setRefused(s.refused);
}

RemoteStats ReadRemoteStats(wire::RemoteTierStats::Reader r) {
  RemoteStats s;
  s.hits = r.getHits();
  s.misses = r.getMisses();
  s.errors = r.getErrors();
  s.fetched_bytes = r.getFetchedBytes();
  s.queued = r.getQueued();
  s.put = r.getPut();
  s.dropped = r.getDropped();
  s.put_bytes = r.getPutBytes();
  s.queue_depth = r.getQueueDepth();
  s.evicted = r.getEvicted();
  s.damaged = r.getDamaged();
  s.breaker_open = r.getBreakerOpen();
  s.breaker_opens = r.getBreakerOpens();
  s.fast_failures = r.getFastFailures();
  s.moved = r.getMoved();
  s.asked = r.getAsked();
  s.misses_cached = r.getMissesCached();
  s.refused = r.getRefused();
  return s;
}

}  // namespace

void WriteDaemonStats(const DaemonStats& d, wire::StatReply::Builder w) {
  const StoreStats& s = d.store;
  w.setEntries(s.entries);
  w.setQuarantined(s.quarantined);
  w.setChunks(s.chunks);
  w.setBytesStored(s.stored_bytes);
  w.setBytesLogical(s.logical_bytes);
  w.setBytesRaw(s.raw_bytes);
  w.setDedupSavedBytes(s.dedup_saved_bytes);
  w.setHits(s.hits);
  w.setMisses(s.misses);
  w.setEvictions(s.evictions);
  w.setAdmissionRefusals(s.admission_refusals);
  w.setActiveLeases(s.active_leases);
  w.setByteBudget(s.byte_budget);
  w.setDiskBytes(s.disk_bytes);
  w.setStagedBytes(s.staged_bytes);
  w.setGroupPublishesOpen(s.group_publishes_open);
  w.setGroupPublishesAborted(s.group_publishes_aborted);
  w.setWriteError(s.write_error);
  w.setBlockCacheUsedBytes(s.block_cache_used_bytes);
  w.setBlockCacheCapacityBytes(s.block_cache_capacity_bytes);
  w.setMemtableBytes(s.memtable_bytes);
  w.setTableReaderBytes(s.table_reader_bytes);
  w.setConnections(d.connections);
  w.setPublishesInFlight(d.publishes_in_flight);
  w.setUncommittedBytes(d.uncommitted_bytes);
  w.setFetchWindowWaits(d.fetch_window_waits);
  w.setRssBytes(d.rss_bytes);
  w.setHeapInUseBytes(d.heap_in_use_bytes);
  w.setHeapFreeBytes(d.heap_free_bytes);
  if (d.remote.has_value()) WriteRemoteStats(*d.remote, w.initRemote());
}

DaemonStats ReadDaemonStats(wire::StatReply::Reader r) {
  DaemonStats d;
  StoreStats& s = d.store;
  s.entries = r.getEntries();
  s.quarantined = r.getQuarantined();
  s.chunks = r.getChunks();
  s.stored_bytes = r.getBytesStored();
  s.logical_bytes = r.getBytesLogical();
  s.raw_bytes = r.getBytesRaw();
  s.dedup_saved_bytes = r.getDedupSavedBytes();
  s.hits = r.getHits();
  s.misses = r.getMisses();
  s.evictions = r.getEvictions();
  s.admission_refusals = r.getAdmissionRefusals();
  s.active_leases = r.getActiveLeases();
  s.byte_budget = r.getByteBudget();
  s.disk_bytes = r.getDiskBytes();
  s.staged_bytes = r.getStagedBytes();
  s.group_publishes_open = r.getGroupPublishesOpen();
  s.group_publishes_aborted = r.getGroupPublishesAborted();
  s.write_error = Str(r.getWriteError());
  s.block_cache_used_bytes = r.getBlockCacheUsedBytes();
  s.block_cache_capacity_bytes = r.getBlockCacheCapacityBytes();
  s.memtable_bytes = r.getMemtableBytes();
  s.table_reader_bytes = r.getTableReaderBytes();
  d.connections = r.getConnections();
  d.publishes_in_flight = r.getPublishesInFlight();
  d.uncommitted_bytes = r.getUncommittedBytes();
  d.fetch_window_waits = r.getFetchWindowWaits();
  d.rss_bytes = r.getRssBytes();
  d.heap_in_use_bytes = r.getHeapInUseBytes();
  d.heap_free_bytes = r.getHeapFreeBytes();
  if (r.hasRemote()) d.remote = ReadRemoteStats(r.getRemote());
  return d;
}

void WriteStoreCheckReport(const StoreCheckReport& report, wire::StoreCheckReport::Builder w) {
  const std::size_t sent = std::min(report.problems.size(), kMaxProblemsSent);
  w.setEntries(report.entries);
  w.setChunks(report.chunks);
  w.setProblemCount(std::max<std::uint64_t>(report.problem_count, report.problems.size()));
  auto ps = w.initProblems(static_cast<unsigned>(sent));
  for (unsigned i = 0; i < sent; ++i) ps.set(i, report.problems[i]);
}

StoreCheckReport ReadStoreCheckReport(wire::StoreCheckReport::Reader r) {
  StoreCheckReport report;
  report.entries = r.getEntries();
  report.chunks = r.getChunks();
  report.problem_count = r.getProblemCount();
  for (auto p : r.getProblems()) report.problems.push_back(Str(p));
  return report;
}

std::size_t WordsFor(const EntryInfo& e) {
  return 48 + e.tokens.size() / 2 +
         (e.model_descriptor.size() + e.model_name.size() + e.ns.size() + e.reason.size()) / 8;
}

std::size_t WordsFor(const ListPage& page) {
  std::size_t words = 64 + page.next_page_token.size() / 8;
  for (const auto& e : page.entries) words += WordsFor(e);
  return words;
}

std::size_t WordsFor(const EntryDetail& d) {
  std::size_t words = 64 + WordsFor(d.info);
  for (const auto& h : d.layer_headers) words += WordsFor(h.size()) + 1;
  return words;
}

std::size_t WordsFor(const StoreCheckReport& report) {
  std::size_t words = 64;
  const std::size_t sent = std::min(report.problems.size(), kMaxProblemsSent);
  for (std::size_t i = 0; i < sent; ++i) words += report.problems[i].size() / 8 + 2;
  return words;
}

}  // namespace primecache::ipc
