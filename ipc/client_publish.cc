// The publish stream: publishBegin, each layer and chunk pipelined (their
// acks awaited at commit), chunks inline or through the shared region's
// publish half, then commit or abort.
#include <cstring>

#include "ipc/client_impl.h"

namespace primecache::client {

namespace {
struct ShmPlace {
  std::uint64_t offset = 0, length = 0;
};
}  // namespace

struct PublishStream::State {
  std::shared_ptr<Client::Impl> impl_owner;  // the stream may outlive its Client
  Client::Impl* impl = nullptr;
  std::shared_ptr<Conn> conn;
  std::uint64_t publish = 0;
  std::uint32_t layer_count = 0;
  std::uint32_t layer = 0;  // layers begun
  std::uint32_t chunk = 0;  // chunks sent of the current layer
  bool open = true;
  // Replies to begin/layer/chunk arrive asynchronously; the first error sticks.
  std::shared_ptr<std::mutex> mu = std::make_shared<std::mutex>();
  std::shared_ptr<std::condition_variable> cv = std::make_shared<std::condition_variable>();
  std::shared_ptr<Status> error = std::make_shared<Status>();
  std::shared_ptr<std::size_t> outstanding = std::make_shared<std::size_t>(0);

  Status Sticky() {
    std::lock_guard<std::mutex> l(*mu);
    return *error;
  }

  // Sends a request whose ack is only awaited at commit; `after` runs when it
  // is answered (frees a shared-memory slot).
  Status SendPipelined(std::uint64_t id, const OutMessage& m, std::function<void()> after = nullptr) {
    auto p = std::make_shared<Pending>();
    {
      std::lock_guard<std::mutex> l(*mu);
      ++*outstanding;
    }
    p->on_done = [mu = mu, cv = cv, error = error, outstanding = outstanding, after](const Status& s) {
      if (after) after();
      std::lock_guard<std::mutex> l(*mu);
      if (!s.ok() && error->ok()) *error = s;
      --*outstanding;
      cv->notify_all();
    };
    conn->Register(id, p);
    Status s = conn->Send(m);
    if (!s.ok()) {
      conn->Forget(id);
      Conn::Complete(p, s, std::nullopt);
    }
    return s;
  }

  // Sends the next chunk of the current layer: `bytes` inline, or, with
  // `place`, the bytes at that place of the shared region. `after` runs once
  // the daemon answered it (or the connection died).
  Status SendChunk(std::span<const std::byte> bytes, std::function<void()> after,
                   std::optional<ShmPlace> place = std::nullopt) {
    if (layer == 0) {
      if (after) after();
      return Status::FailedPrecondition("a chunk before BeginLayer");
    }
    const std::uint64_t id = impl->NextId();
    auto m = BuildRequest(
        id,
        [&](wire::Request::Builder r) {
          auto c = r.initPublishChunk();
          c.setPublish(publish);
          c.setLayer(layer - 1);
          c.setIndex(chunk);
          if (place) {
            auto s = c.initData().initShm();
            s.setOffset(place->offset);
            s.setLength(place->length);
          } else {
            c.initData().setInline(KjBytes(bytes));
          }
        },
        ipc::WordsFor(bytes.size()));
    PC_RETURN_IF_ERROR(SendPipelined(id, *m, std::move(after)));
    ++chunk;
    return Status::Ok();
  }
};

PublishStream::PublishStream(std::unique_ptr<State> st) : st_(std::move(st)) {}
PublishStream::~PublishStream() {
  if (st_ && st_->open) (void)Abort();
}

Result<std::unique_ptr<PublishStream>> Client::BeginPublish(const ModelId& model, std::span<const std::uint32_t> tokens,
                                                            std::uint32_t layer_count,
                                                            const std::optional<PublishGroup>& group) {
  PC_ASSIGN_OR_RETURN(auto c, impl_->Get());
  if (group && !server_info().group_publish) {
    return Status::NotSupported("the daemon does not take group publishes (an older primecached)");
  }
  auto st = std::make_unique<PublishStream::State>();
  st->impl_owner = impl_;
  st->impl = impl_.get();
  st->conn = c;
  st->publish = impl_->NextId();
  st->layer_count = layer_count;
  auto m = BuildRequest(
      st->publish,
      [&](wire::Request::Builder r) {
        auto pb = r.initPublishBegin();
        pb.setLayerCount(layer_count);
        if (!(model.cost == ModelCost{})) {
          auto c = pb.initCost();
          c.setFlopsPerToken(model.cost.flops_per_token);
          c.setAttentionLayers(model.cost.attention_layers);
          c.setAttentionFlopsPerPair(model.cost.attention_flops_per_pair);
        }
        if (group) {
          auto g = pb.initGroup();
          g.setToken(group->token);
          g.setRanks(group->ranks);
          g.setRank(group->rank);
        }
        auto b = pb.initBoundary();
        SetFingerprint(b.initFingerprint(), model);
        b.setNamespace(impl_->opts.ns);
        SetTokens(b, tokens);
      },
      tokens.size() / 2 + 64);
  PC_RETURN_IF_ERROR(st->SendPipelined(st->publish, *m));
  return std::unique_ptr<PublishStream>(new PublishStream(std::move(st)));
}

Status PublishStream::BeginLayer(std::span<const std::byte> header, std::uint32_t chunk_count) {
  if (!st_->open) return Status::FailedPrecondition("publish is closed");
  PC_RETURN_IF_ERROR(st_->Sticky());
  const std::uint64_t id = st_->impl->NextId();
  const std::uint32_t layer = st_->layer;
  auto m = BuildRequest(
      id,
      [&](wire::Request::Builder r) {
        auto l = r.initPublishLayer();
        l.setPublish(st_->publish);
        l.setLayer(layer);
        l.setChunkCount(chunk_count);
        l.setHeader(KjBytes(header));
      },
      ipc::WordsFor(header.size()));
  PC_RETURN_IF_ERROR(st_->SendPipelined(id, *m));
  ++st_->layer;
  st_->chunk = 0;
  return Status::Ok();
}

Status PublishStream::AddChunk(std::span<const std::byte> bytes) {
  if (!st_->open) return Status::FailedPrecondition("publish is closed");
  PC_RETURN_IF_ERROR(st_->Sticky());
  const auto& space = st_->conn->space;
  if (space && !bytes.empty() && bytes.size() <= st_->conn->info.max_chunk_bytes &&
      ReservedChunk::Space::Round(bytes.size()) <= space->limit) {
    PC_ASSIGN_OR_RETURN(ReservedChunk chunk, ReserveChunk(bytes.size()));
    std::memcpy(chunk.bytes().data(), bytes.data(), bytes.size());
    return AddReservedChunk(std::move(chunk));
  }
  return st_->SendChunk(bytes, nullptr);
}

Result<ReservedChunk> PublishStream::ReserveChunk(std::size_t size) {
  if (!st_->open) return Status::FailedPrecondition("publish is closed");
  PC_RETURN_IF_ERROR(st_->Sticky());
  const std::uint64_t max_chunk = st_->conn->info.max_chunk_bytes;
  if (size == 0 || size > max_chunk) {
    return Status::InvalidArgument("chunk of " + std::to_string(size) + " bytes: the daemon takes 1.." +
                                   std::to_string(max_chunk));
  }
  ReservedChunk chunk;
  const auto& space = st_->conn->space;
  if (!space) {
    chunk.own_ = std::make_unique_for_overwrite<std::byte[]>(size);
    chunk.bytes_ = {chunk.own_.get(), size};
    return chunk;
  }
  const std::uint64_t len = ReservedChunk::Space::Round(size);
  if (len > space->limit) {
    return Status::InvalidArgument("chunk of " + std::to_string(size) + " bytes is larger than the publish half of " +
                                   "the shared region (" + std::to_string(space->limit) +
                                   " bytes; raise ClientOptions::shared_memory_bytes)");
  }
  PC_ASSIGN_OR_RETURN(std::uint64_t off, space->Take(len, st_->impl->opts.timeout));
  chunk.space_ = space;
  chunk.offset_ = off;
  chunk.reserved_ = len;
  chunk.bytes_ = {space->region->data() + off, size};
  return chunk;
}

Status PublishStream::AddReservedChunk(ReservedChunk chunk, std::size_t length) {
  if (!st_->open) return Status::FailedPrecondition("publish is closed");
  PC_RETURN_IF_ERROR(st_->Sticky());
  if (length > chunk.size()) {
    return Status::InvalidArgument("AddReservedChunk of " + std::to_string(length) + " bytes from a reservation of " +
                                   std::to_string(chunk.size()));
  }
  if (!chunk.space_ || length == 0) return st_->SendChunk(chunk.bytes().first(length), nullptr);
  if (chunk.space_ != st_->conn->space) {
    return Status::FailedPrecondition("the chunk was reserved on another connection (the daemon restarted?)");
  }
  // The tail past `length` goes back now; the rest once the daemon stored it.
  const std::uint64_t keep = ReservedChunk::Space::Round(length);
  chunk.space_->Give(chunk.offset_ + keep, chunk.reserved_ - keep);
  auto space = std::move(chunk.space_);
  const std::uint64_t off = chunk.offset_;
  chunk.GiveBack();  // owns nothing any more
  return st_->SendChunk({}, [space, off, keep] { space->Give(off, keep); }, ShmPlace{off, length});
}

Result<PublishResult> PublishStream::Commit() {
  if (!st_->open) return Status::FailedPrecondition("publish is closed");
  st_->open = false;
  Client::Impl* impl = st_->impl;
  const std::uint64_t id = impl->NextId();
  auto m = BuildRequest(id, [&](wire::Request::Builder r) { r.initPublishCommit().setPublish(st_->publish); });
  auto reply = impl->Call(st_->conn, id, *m);
  {
    // Every earlier ack has arrived before the commit's reply (one queue per
    // publish), unless the connection died; wait briefly for stragglers.
    std::unique_lock<std::mutex> l(*st_->mu);
    st_->cv->wait_for(l, impl->opts.timeout, [&] { return *st_->outstanding == 0; });
    if (!st_->error->ok()) return *st_->error;
  }
  return Expect<PublishResult>(std::move(reply), st_->conn->limits, wire::Response::PUBLISHED,
                               [](wire::Response::Reader r) { return ipc::ReadPublishResult(r.getPublished()); });
}

Status PublishStream::Abort() {
  if (!st_->open) return Status::Ok();
  st_->open = false;
  Client::Impl* impl = st_->impl;
  const std::uint64_t id = impl->NextId();
  auto m = BuildRequest(id, [&](wire::Request::Builder r) { r.initPublishAbort().setPublish(st_->publish); });
  auto reply = impl->Call(st_->conn, id, *m);
  if (!reply.ok() && !reply.status().IsNotFound()) return reply.status();
  return Status::Ok();
}

Result<PublishResult> Client::Publish(const ModelId& model, std::span<const std::uint32_t> tokens,
                                      const std::vector<LayerData>& layers) {
  PC_ASSIGN_OR_RETURN(auto stream, BeginPublish(model, tokens, static_cast<std::uint32_t>(layers.size())));
  for (const auto& layer : layers) {
    PC_RETURN_IF_ERROR(stream->BeginLayer(layer.header, static_cast<std::uint32_t>(layer.chunks.size())));
    for (const auto& ch : layer.chunks) PC_RETURN_IF_ERROR(stream->AddChunk(ch));
  }
  return stream->Commit();
}

std::future<Result<PublishResult>> Client::PublishAsync(const ModelId& model, std::vector<std::uint32_t> tokens,
                                                        std::vector<LayerData> layers) {
  return std::async(std::launch::async, [this, model, tokens = std::move(tokens), layers = std::move(layers)] {
    return Publish(model, tokens, layers);
  });
}

}  // namespace primecache::client
