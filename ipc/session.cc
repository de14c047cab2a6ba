#include "ipc/session.h"

#include <algorithm>
#include <exception>
#include <utility>

#include <kj/exception.h>

#include "ipc/fetch_sender.h"
#include "ipc/session_internal.h"
#include "ipc/wire.h"

// The session's dispatcher and what every request family shares. The
// families' handlers are in session_publish.cc, session_fetch.cc,
// session_lookup.cc and session_admin.cc.

namespace primecache::ipc {

using session_internal::NowNs;
using session_internal::ReadText;

Session::Session(Store* store, Executor* executor, Executor* fetch_executor,
                 std::shared_ptr<ResponseSink> sink, SessionLimits limits, PeerInfo peer, ServerCounters* counters,
                 DeviceDma* device_dma, std::function<std::optional<RemoteStats>()> remote_stats)
    : store_(store), remote_stats_(std::move(remote_stats)), executor_(executor), fetch_executor_(fetch_executor), sink_(std::move(sink)), limits_(limits), peer_(std::move(peer)),
      counters_(counters), device_dma_(device_dma) {
  last_answer_ns_ = NowNs();
}

Session::~Session() {
  if (shm_) {
    counters_->shm_regions.fetch_sub(1, std::memory_order_relaxed);
    counters_->shm_bytes.fetch_sub(shm_->size(), std::memory_order_relaxed);
  }
}

Answer Session::Serve(Executor* executor, std::uint64_t id, std::function<Answer()> job) {
  jobs_in_flight_.fetch_add(1);
  executor->Post([self = shared_from_this(), id, job = std::move(job)] {
    self->Deliver(id, job());
    self->last_answer_ns_ = NowNs();
    self->jobs_in_flight_.fetch_sub(1);
  });
  return Answer::Queued();
}

void Session::Deliver(std::uint64_t id, Answer answer) {
  switch (answer.kind_) {
    case Answer::Kind::kQueued:
      return;  // its work delivers its own answer
    case Answer::Kind::kReply:
      sink_->Send(std::move(answer.reply_));
      return;
    case Answer::Kind::kError:
      sink_->Send(ErrorResponse(id, answer.code_, answer.message_));
      return;
  }
}

bool Session::Busy() const {
  if (jobs_in_flight_.load() != 0) return true;
  MutexLock l(&mu_);
  return publishes_open_ != 0 || !fetches_.empty();
}

std::chrono::steady_clock::time_point Session::last_answer() const {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(last_answer_ns_.load()));
}

bool Session::InboundBlocked() const {
  MutexLock l(&mu_);
  return backlog_bytes_ > limits_.max_publish_backlog_bytes;
}

std::optional<Answer> Session::RefuseNamespace(capnp::Text::Reader ns) const {
  auto text = ReadText(ns, limits_.max_text_bytes, "namespace");
  if (!text.ok()) return Answer(text.status());
  if (!text->empty() && *text != ns_) return Answer::PermissionDenied("namespace differs from the connection's");
  return std::nullopt;
}

std::optional<std::string> Session::TenantScope() const {
  if (peer_.admin) return std::nullopt;
  return ns_;
}

void Session::OnClose() {
  std::vector<std::shared_ptr<Publish>> pubs;
  std::vector<std::shared_ptr<FetchState>> fetches;
  {
    MutexLock l(&mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [id, p] : publishes_) pubs.push_back(p);
    for (auto& [id, f] : fetches_) fetches.push_back(f);
    publishes_.clear();
  }
  for (auto& f : fetches) f->Cancel();
  for (auto& p : pubs) QueueFinishPublish(p);  // abort: leaves nothing
}

Session::Connection Session::OnFrame(Frame frame, std::vector<int>* fds) {
  {
    MutexLock l(&mu_);
    if (closed_) return Connection::kClose;
  }
  try {
    return Dispatch(frame, &frame, fds);
  } catch (const kj::Exception& e) {
    Deliver(0, Answer::Protocol(std::string("malformed message: ") + e.getDescription().cStr()));
  } catch (const std::exception& e) {
    Deliver(0, Answer::Protocol(std::string("malformed message: ") + e.what()));
  }
  return Connection::kKeep;
}

Session::Connection Session::Dispatch(const Frame& frame_ref, Frame* owned, std::vector<int>* fds) {
  auto reader = frame_ref.Reader(limits_.frame);
  {
    // Walk the whole message once: any pointer anywhere that is out of
    // bounds, too deep, or that aliases its way past the traversal budget
    // is refused here, before a field is used.
    auto any = reader->getRoot<capnp::AnyPointer>();
    (void)any.targetSize();
  }
  auto req = reader->getRoot<wire::Request>();
  const std::uint64_t id = req.getId();
  const auto which = req.which();

  if (!peer_.refused.empty()) {
    // Answered (rather than hung up on) so the peer learns why; then closed.
    Deliver(id, Answer::PermissionDenied(peer_.refused));
    return Connection::kClose;
  }
  if (!hello_done_ && which != wire::Request::HELLO) {
    Deliver(id, Answer::Protocol("the first request must be hello"));
    return Connection::kKeep;
  }
  const Incoming in{id, req, owned, fds};
  if (which == wire::Request::SHM_RELEASE || which == wire::Request::DEVICE_RELEASE) {
    if (auto refused = OnWindowRelease(in)) Deliver(id, std::move(*refused));
    return Connection::kKeep;
  }
  Deliver(id, Handle(in));
  return Connection::kKeep;
}

Answer Session::Handle(const Incoming& in) {
  const auto which = in.req.which();
  switch (which) {
    case wire::Request::HELLO:
      return OnHello(in);
    case wire::Request::PUBLISH_BEGIN:
      return OnPublishBegin(in);
    case wire::Request::PUBLISH_LAYER:
    case wire::Request::PUBLISH_CHUNK:
    case wire::Request::PUBLISH_COMMIT:
    case wire::Request::PUBLISH_ABORT:
      return OnPublishStep(in);
    case wire::Request::LOOKUP:
      return OnLookup(in);
    case wire::Request::FETCH:
      return OnFetch(in);
    case wire::Request::ATTACH_DEVICE:
      return OnAttachDevice(in);
    case wire::Request::CANCEL:
      return OnCancel(in);
    case wire::Request::DELETE:
    case wire::Request::SET_BYTE_BUDGET:
    case wire::Request::COMPACT:
      return OnAdminOp(in);
    case wire::Request::LIST:
      return OnList(in);
    case wire::Request::STAT:
      return OnStat(in);
    case wire::Request::DESCRIBE:
      return OnDescribe(in);
    case wire::Request::CHECK_STORE:
      return OnCheckStore(in);
    case wire::Request::CHECK_ENTRY:
      return OnCheckEntry(in);
    case wire::Request::SHM_ATTACH:
      return OnShmAttach(in);
    default:
      return Answer::Protocol("unknown request kind " + std::to_string(static_cast<int>(which)));
  }
}

Answer Session::OnHello(const Incoming& in) {
  const std::uint64_t id = in.id;
  auto h = in.req.getHello();
  if (hello_done_) return Answer::Protocol("hello sent twice");
  const std::uint32_t lo = std::max(h.getMinVersion(), kMinProtocolVersion);
  const std::uint32_t hi = std::min(h.getMaxVersion(), kMaxProtocolVersion);
  if (lo > hi) {
    return Status::NotSupported("no common protocol version: daemon speaks " + std::to_string(kMinProtocolVersion) +
                                ".." + std::to_string(kMaxProtocolVersion));
  }
  auto ns = ReadText(h.getNamespace(), limits_.max_text_bytes, "namespace");
  if (!ns.ok()) return ns.status();
  if (peer_.allowed_namespaces.has_value() &&
      std::find(peer_.allowed_namespaces->begin(), peer_.allowed_namespaces->end(), *ns) ==
          peer_.allowed_namespaces->end()) {
    return Answer::PermissionDenied("namespace '" + *ns + "' is not allowed for uid " + std::to_string(peer_.uid));
  }
  constexpr std::uint32_t kNotARank = 0xffffffff;
  if (h.getTpRank() != kNotARank && h.getTpRank() >= RankBytes::kRanks) {
    return Status::InvalidArgument("hello: TP rank " + std::to_string(h.getTpRank()) + " is beyond " +
                                   std::to_string(RankBytes::kRanks - 1));
  }
  ns_ = *ns;
  if (h.getTpRank() != kNotARank) tp_rank_ = h.getTpRank();
  hello_done_ = true;
  return BuildResponse(id, [&](wire::Response::Builder r) {
    auto hr = r.initHello();
    hr.setVersion(hi);
    hr.setServer("primecached");
    hr.setMaxMessageBytes(limits_.frame.max_message_bytes);
    hr.setMaxChunkBytes(limits_.max_chunk_bytes);
    hr.setMaxPublishesInFlight(limits_.max_publishes_in_flight);
    hr.setAdmin(peer_.admin);
    hr.setDeviceCopies(device_dma_ != nullptr);
    hr.setFetchByQuery(true);
    hr.setGroupPublish(true);
  });
}

}  // namespace primecache::ipc
