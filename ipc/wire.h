// Helpers shared by the daemon and the client: status <-> wire error codes,
// response building, and the one mapping of each shared value type
// (primecache/entry.h) onto the schema, each direction written once: the
// daemon writes with Write*, the client reads with Read*.
#pragma once

#include <capnp/message.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ipc/framing.h"
#include "ipc/primecache.capnp.h"
#include "primecache/entry.h"
#include "primecache/status.h"

namespace primecache::ipc {

// The protocol versions this build speaks (hello's minVersion..maxVersion;
// docs/protocol.md).
inline constexpr std::uint32_t kMinProtocolVersion = 1;
inline constexpr std::uint32_t kMaxProtocolVersion = 1;

wire::ErrorCode ToWireCode(StatusCode code);
// The Status a client sees for a wire error. permissionDenied and protocol
// have no StatusCode of their own: they map to kFailedPrecondition and
// kInvalidArgument, and the message starts with "permission denied: " or
// "protocol: ".
Status FromWireError(wire::ErrorCode code, std::string message);

// A Response with `id`, filled by `fill(wire::Response::Builder)`.
// first_segment_words sizes the builder's first segment (0: default).
template <typename F>
std::unique_ptr<OutMessage> BuildResponse(std::uint64_t id, F&& fill, std::size_t first_segment_words = 0) {
  auto b = first_segment_words != 0
               ? std::make_unique<capnp::MallocMessageBuilder>(static_cast<unsigned>(first_segment_words))
               : std::make_unique<capnp::MallocMessageBuilder>();
  auto r = b->initRoot<wire::Response>();
  r.setId(id);
  std::forward<F>(fill)(r);
  return std::make_unique<OutMessage>(std::move(b));
}

template <typename F>
std::unique_ptr<OutMessage> BuildRequest(std::uint64_t id, F&& fill, std::size_t first_segment_words = 0) {
  auto b = first_segment_words != 0
               ? std::make_unique<capnp::MallocMessageBuilder>(static_cast<unsigned>(first_segment_words))
               : std::make_unique<capnp::MallocMessageBuilder>();
  auto r = b->initRoot<wire::Request>();
  r.setId(id);
  std::forward<F>(fill)(r);
  return std::make_unique<OutMessage>(std::move(b));
}

std::unique_ptr<OutMessage> ErrorResponse(std::uint64_t id, wire::ErrorCode code, const std::string& message);
inline std::unique_ptr<OutMessage> ErrorResponse(std::uint64_t id, const Status& s) {
  return ErrorResponse(id, ToWireCode(s.code()), s.message());
}

// A UInt32 list copied out (capnp's iterators are not std iterators).
inline std::vector<std::uint32_t> ToVector(capnp::List<std::uint32_t>::Reader l) {
  std::vector<std::uint32_t> v;
  v.reserve(l.size());
  for (unsigned i = 0; i < l.size(); ++i) v.push_back(l[i]);
  return v;
}

// Words to reserve for a message carrying `bytes` of payload.
inline std::size_t WordsFor(std::size_t bytes) { return bytes / 8 + 64; }

void WritePublishResult(const PublishResult& p, wire::Published::Builder w);
PublishResult ReadPublishResult(wire::Published::Reader r);
void WriteEntryInfo(const EntryInfo& e, wire::EntryInfo::Builder w);
EntryInfo ReadEntryInfo(wire::EntryInfo::Reader r);
void WriteListPage(const ListPage& page, wire::ListReply::Builder w);
ListPage ReadListPage(wire::ListReply::Reader r);
void WriteEntryDetail(const EntryDetail& d, wire::DescribeReply::Builder w);
EntryDetail ReadEntryDetail(wire::DescribeReply::Reader r);
// nullopt: a miss (found is false).
// shared_tokens: LookupReply.sharedTokens (0 when not asked for).
void WriteLookupHit(const std::optional<LookupHit>& hit, std::uint64_t shared_tokens,
                    wire::LookupReply::Builder w);
// A daemon's hit for a query of `query_tokens` tokens: kCorruption when it is
// no prefix of the query (no tokens, or more than the query has).
Result<std::optional<LookupHit>> ReadLookupHit(wire::LookupReply::Reader r, std::size_t query_tokens);
void WriteDaemonStats(const DaemonStats& s, wire::StatReply::Builder w);
DaemonStats ReadDaemonStats(wire::StatReply::Reader r);
// Writes at most kMaxProblemsSent problems; problemCount counts them all.
inline constexpr std::size_t kMaxProblemsSent = 1000;
void WriteStoreCheckReport(const StoreCheckReport& report, wire::StoreCheckReport::Builder w);
StoreCheckReport ReadStoreCheckReport(wire::StoreCheckReport::Reader r);

// Message words the values above take when written, with room to spare.
std::size_t WordsFor(const EntryInfo& e);
std::size_t WordsFor(const ListPage& page);
std::size_t WordsFor(const EntryDetail& d);
std::size_t WordsFor(const StoreCheckReport& report);

}  // namespace primecache::ipc
