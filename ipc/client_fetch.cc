// Fetch delivery: the request with the windows it may use, each streamed
// layer and chunk handed to the callbacks (inline bytes, bytes in the shared
// region, or in the device window), and the releases that give the windows'
// room back to the daemon.
#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include "ipc/client_impl.h"

namespace primecache::client {

namespace {

// The chunks of one fetch handed over in one window (the shared one with
// on_chunk_held, or the device one): releases are sent in arrival order, each
// only once every chunk before it was released too, and the window is free
// for another fetch once the fetch ended and every chunk was released.
class HeldChunks : public std::enable_shared_from_this<HeldChunks> {
 public:
  // `region`: kept mapped while chunks in it are held (null for the device).
  HeldChunks(std::weak_ptr<Conn> conn, std::shared_ptr<ipc::ShmRegion> region, std::shared_ptr<FetchWindow> window,
             bool device)
      : conn_(std::move(conn)), region_(std::move(region)), window_(std::move(window)), device_(device) {}

  // The fetch has ended: the window is freed once every chunk is released.
  void EndFetch() {
    std::lock_guard<std::mutex> l(mu_);
    ended_ = true;
    if (queue_.empty()) window_->Free();
  }

  ChunkRelease Hold(std::uint64_t offset, std::uint64_t length) {
    std::lock_guard<std::mutex> l(mu_);
    const std::uint64_t seq = first_ + queue_.size();
    queue_.push_back({offset, length, false});
    // The closure keeps the mapping alive while the bytes are in use.
    auto self = shared_from_this();
    auto once = std::make_shared<std::atomic<bool>>(false);
    return [self, seq, once] {
      if (!once->exchange(true)) self->Release(seq);
    };
  }

 private:
  struct Held {
    std::uint64_t offset, length;
    bool done;
  };
  void Release(std::uint64_t seq) {
    std::lock_guard<std::mutex> l(mu_);
    queue_[seq - first_].done = true;
    auto conn = conn_.lock();
    while (!queue_.empty() && queue_.front().done) {
      if (conn) {
        auto rel = BuildRequest(0, [&](wire::Request::Builder q) {
          if (device_) {
            auto x = q.initDeviceRelease();
            x.setOffset(queue_.front().offset);
            x.setLength(queue_.front().length);
          } else {
            auto x = q.initShmRelease();
            x.setOffset(queue_.front().offset);
            x.setLength(queue_.front().length);
          }
        });
        (void)conn->Send(*rel);  // a lost connection has ended the fetch anyway
      }
      queue_.pop_front();
      ++first_;
    }
    if (ended_ && queue_.empty()) window_->Free();
  }

  std::mutex mu_;
  std::weak_ptr<Conn> conn_;
  std::shared_ptr<ipc::ShmRegion> region_;
  std::shared_ptr<FetchWindow> window_;
  const bool device_;
  bool ended_ = false;
  std::deque<Held> queue_;
  std::uint64_t first_ = 0;  // sequence number of queue_.front()
};

// However a fetch ends, its use of the window ends: at once, or, with chunks
// held, once they are released.
struct WindowUse {
  bool taken;
  FetchWindow* window;
  HeldChunks* held;
  ~WindowUse() {
    if (held != nullptr) {
      held->EndFetch();
    } else if (taken) {
      window->Free();
    }
  }
};

// What a fetch's stream set up: the layer announced last (FetchLayer; every
// chunk must be one of its), and whether the fetch asked for the shared
// window (the region's second half; a chunk may lie only there).
struct Announced {
  bool any = false;
  std::uint32_t layer = 0, chunks = 0;
  bool shm_window = false;
};

// A fetchChunk's chunks, read as coming from a hostile daemon: one chunk
// (count 0, from an older daemon, or 1) or an extent of `count` adjacent
// chunks of the layer announced last, inside its chunk count, their sizes
// adding up to `length` (where they lie is checked by the window's user).
struct ChunkRun {
  std::uint32_t layer = 0, index = 0;
  std::uint64_t length = 0;
  std::vector<std::uint64_t> sizes;
};

Result<ChunkRun> ReadRun(wire::FetchChunk::Reader ch, std::uint64_t length, const Announced& at) {
  ChunkRun run;
  run.layer = ch.getLayer();
  run.index = ch.getIndex();
  run.length = length;
  const std::uint32_t count = ch.getCount();
  auto sizes = ch.getSizes();
  const std::string what = "daemon sent chunks " + std::to_string(run.index) + " + " + std::to_string(count) +
                           " of layer " + std::to_string(run.layer);
  if (!at.any || run.layer != at.layer) return Status::Corruption(what + ", not of the layer it announced");
  if (sizes.size() == 0) {
    if (count > 1) return Status::Corruption(what + " without their sizes");
    run.sizes.push_back(length);
  } else if (count == 0 || sizes.size() != count) {
    return Status::Corruption(what + " with " + std::to_string(sizes.size()) + " sizes");
  }
  const std::uint32_t n = std::max<std::uint32_t>(count, 1);
  if (run.index > at.chunks || n > at.chunks - run.index) {
    return Status::Corruption(what + " past the layer's " + std::to_string(at.chunks) + " chunks");
  }
  if (!run.sizes.empty()) return run;
  std::uint64_t left = length;
  for (std::uint64_t size : sizes) {
    if (size > left) return Status::Corruption(what + ": their sizes exceed the extent's " + std::to_string(length) + " bytes");
    left -= size;
    run.sizes.push_back(size);
  }
  if (left != 0) return Status::Corruption(what + ": their sizes fall short of the extent's " + std::to_string(length) + " bytes");
  return run;
}

// An extent the daemon copied into the device window: lent to on_device_extent.
Status DeliverDeviceExtent(Conn& conn, HeldChunks* device, const FetchCallbacks& cb, wire::FetchChunk::Reader ch,
                           const Announced& at) {
  auto ref = ch.getData().getDevice();
  const std::uint64_t size = conn.device_size;
  if (device == nullptr || !cb.on_device_extent) {
    return Status::Corruption("daemon sent a device chunk to a fetch without a device window");
  }
  if (ref.getOffset() > size || ref.getLength() > size - ref.getOffset()) {
    return Status::Corruption("daemon pointed outside the device window");
  }
  PC_ASSIGN_OR_RETURN(ChunkRun run, ReadRun(ch, ref.getLength(), at));
  DeviceExtent x;
  x.layer = run.layer;
  x.index = run.index;
  x.count = static_cast<std::uint32_t>(run.sizes.size());
  x.offset = ref.getOffset();
  x.length = ref.getLength();
  x.sizes = run.sizes;
  return cb.on_device_extent(x, device->Hold(ref.getOffset(), ref.getLength()));
}

// The chunks of an extent in the shared region, handed over one by one: to
// on_chunk_held, each with a release of its own, the extent's one release
// sent once every chunk's was called; else to on_chunk, released after.
Status DeliverShmRun(Conn& conn, HeldChunks* held, const FetchCallbacks& cb, const ChunkRun& run,
                     std::uint64_t offset) {
  const std::byte* base = conn.shm->data() + offset;
  if (cb.on_chunk_held && held != nullptr) {
    ChunkRelease whole = held->Hold(offset, run.length);
    auto left = std::make_shared<std::atomic<std::size_t>>(run.sizes.size());
    auto part = [whole, left] {
      if (left->fetch_sub(1) == 1) whole();
    };
    std::uint64_t at = 0;
    for (std::size_t i = 0; i < run.sizes.size(); ++i) {
      auto once = std::make_shared<std::atomic<bool>>(false);
      ChunkRelease release = [part, once] {
        if (!once->exchange(true)) part();
      };
      Status s = cb.on_chunk_held(run.layer, run.index + static_cast<std::uint32_t>(i),
                                  {base + at, static_cast<std::size_t>(run.sizes[i])}, std::move(release));
      at += run.sizes[i];
      if (!s.ok()) {
        for (std::size_t j = i + 1; j < run.sizes.size(); ++j) part();  // never handed over
        return s;
      }
    }
    return Status::Ok();
  }
  Status s;
  std::uint64_t at = 0;
  for (std::size_t i = 0; s.ok() && cb.on_chunk && i < run.sizes.size(); ++i) {
    s = cb.on_chunk(run.layer, run.index + static_cast<std::uint32_t>(i),
                    {base + at, static_cast<std::size_t>(run.sizes[i])});
    at += run.sizes[i];
  }
  auto rel = BuildRequest(0, [&](wire::Request::Builder q) {
    auto x = q.initShmRelease();
    x.setOffset(offset);
    x.setLength(run.length);
  });
  (void)conn.Send(*rel);
  return s;
}

// Hands one fetchChunk's chunks to the callbacks: inline bytes, bytes in the
// region (released to the daemon after on_chunk, or when the holder of an
// on_chunk_held loan releases it), or an extent in the device window.
Status DeliverChunk(Conn& conn, HeldChunks* held, HeldChunks* device, const FetchCallbacks& cb,
                    wire::FetchChunk::Reader ch, const Announced& at) {
  auto d = ch.getData();
  if (d.which() == wire::Payload::DEVICE) return DeliverDeviceExtent(conn, device, cb, ch, at);
  if (d.which() == wire::Payload::INLINE) {
    PC_ASSIGN_OR_RETURN(ChunkRun run, ReadRun(ch, d.getInline().size(), at));
    if (run.sizes.size() != 1) return Status::Corruption("daemon sent several chunks inline in one message");
    if (cb.on_chunk_held) {
      // The message's bytes go with the frame: the chunk gets a copy of its own.
      auto copy = std::make_shared<std::vector<std::byte>>(Bytes(d.getInline()).begin(), Bytes(d.getInline()).end());
      return cb.on_chunk_held(ch.getLayer(), ch.getIndex(), *copy, [copy]() mutable { copy.reset(); });
    }
    return cb.on_chunk ? cb.on_chunk(ch.getLayer(), ch.getIndex(), Bytes(d.getInline())) : Status::Ok();
  }
  if (d.which() != wire::Payload::SHM) return Status::Corruption("daemon sent a chunk of an unknown kind");
  auto ref = d.getShm();
  const std::uint64_t half = conn.shm ? conn.shm->size() / 2 : 0;
  if (!at.shm_window || !conn.shm->Contains(ref.getOffset(), ref.getLength()) || ref.getOffset() < half) {
    return Status::Corruption("daemon pointed outside the fetch's shared window");
  }
  PC_ASSIGN_OR_RETURN(ChunkRun run, ReadRun(ch, ref.getLength(), at));
  return DeliverShmRun(conn, held, cb, run, ref.getOffset());
}

}  // namespace

namespace {

// What a fetch names: entry `entry`, or (with `model`, a fetch by query) the
// longest stored prefix of `tokens` in the connection's namespace.
struct FetchTarget {
  std::uint64_t entry = 0;
  const ModelId* model = nullptr;
  std::span<const std::uint32_t> tokens;
  bool want_shared = false;
  bool skip_parted_hits = false;  // FetchCallbacks::skip_parted_hits
};

// A fetch request: with the shared window (the region's second half) when
// `shm` is given, and the device window's first `device_bytes` when not 0.
std::unique_ptr<OutMessage> FetchRequest(std::uint64_t id, const FetchTarget& t, std::string_view ns,
                                         std::span<const std::uint32_t> layers, const ipc::ShmRegion* shm,
                                         std::uint64_t device_bytes) {
  return BuildRequest(
      id,
      [&](wire::Request::Builder r) {
        auto f = r.initFetch();
        f.setEntry(t.entry);
        if (t.model != nullptr) {
          auto l = f.initQuery();
          l.setWantShared(t.want_shared);
          f.setSkipPartedHits(t.skip_parted_hits);
          auto q = l.initQuery();
          SetFingerprint(q.initFingerprint(), *t.model);
          q.setNamespace(std::string(ns));
          SetTokens(q, t.tokens);
        }
        auto l = f.initLayers(static_cast<unsigned>(layers.size()));
        for (unsigned i = 0; i < layers.size(); ++i) l.set(i, layers[i]);
        if (shm != nullptr) {
          const std::uint64_t half = shm->size() / 2;
          auto w = f.initShmWindow();
          w.setOffset(half);
          w.setLength(shm->size() - half);
        }
        f.setExtents(true);  // an extent's chunks are handed to the callbacks one by one, or as one device extent
        if (device_bytes != 0) {
          auto w = f.initDeviceWindow();
          w.setOffset(0);
          w.setLength(device_bytes);
        }
      },
      t.tokens.size() / 2 + 64);
}

// What a fetch by query's stream said of its hit: fetchHit must come first,
// once, and a miss streams nothing else.
struct HitSeen {
  bool seen = false;
  std::optional<LookupHit> hit;
  std::uint64_t shared_tokens = 0;
};

// One fetch of `t` on a connection; false never (a Result for Retry).
Result<bool> FetchOnce(Client::Impl& impl, const FetchTarget& t, std::span<const std::uint32_t> layers,
                       const FetchCallbacks& cb, HitSeen* seen) {
  PC_ASSIGN_OR_RETURN(auto c, impl.Get());
  const bool use_shm = c->shm != nullptr && c->window->TryTake();
  const std::uint64_t device_bytes = cb.on_device_extent ? c->device_size.load() : 0;
  const bool use_device = device_bytes != 0 && c->device_window->TryTake();
  std::shared_ptr<HeldChunks> held;
  std::shared_ptr<HeldChunks> device;
  if (use_shm && cb.on_chunk_held) held = std::make_shared<HeldChunks>(c, c->shm, c->window, false);
  if (use_device) device = std::make_shared<HeldChunks>(c, nullptr, c->device_window, true);
  const WindowUse guard{use_shm, c->window.get(), held.get()};
  const WindowUse device_guard{use_device, c->device_window.get(), device.get()};
  const std::uint64_t id = impl.NextId();
  auto m = FetchRequest(id, t, impl.opts.ns, layers, use_shm ? c->shm.get() : nullptr, use_device ? device_bytes : 0);
  bool streamed = false;
  Announced at;
  at.shm_window = use_shm;
  Conn* raw = c.get();
  *seen = HitSeen{};
  // A parted hit the caller skips: an older daemon streams it anyway, and
  // the fetch cancels itself at its first layer (an end, not an error).
  bool skipping = false;
  bool cancelled_skip = false;
  auto reply = impl.Call(c, id, *m, [&, raw](wire::Response::Reader r) -> Status {
    streamed = true;
    if (r.which() == wire::Response::FETCH_HIT) {
      if (t.model == nullptr || seen->seen) return Status::Corruption("daemon sent a fetch hit out of place");
      seen->seen = true;
      PC_ASSIGN_OR_RETURN(seen->hit, ipc::ReadLookupHit(r.getFetchHit(), t.tokens.size()));
      seen->shared_tokens = r.getFetchHit().getSharedTokens();
      if (seen->hit && cb.on_hit) PC_RETURN_IF_ERROR(cb.on_hit(*seen->hit));
      skipping = seen->hit && t.skip_parted_hits && seen->hit->ranks > 1;
      return Status::Ok();
    }
    if (skipping) {
      cancelled_skip = true;
      return Status::Aborted("a tensor-parallel hit the caller fetches by parts");
    }
    if (t.model != nullptr && !seen->hit) {
      return Status::Corruption(seen->seen ? "daemon streamed layers after a miss"
                                           : "daemon streamed a fetch by query before its hit");
    }
    if (r.which() == wire::Response::FETCH_LAYER) {
      auto l = r.getFetchLayer();
      at = {true, l.getLayer(), l.getChunkCount(), use_shm};
      return cb.on_layer ? cb.on_layer(l.getLayer(), Bytes(l.getHeader()), l.getChunkCount()) : Status::Ok();
    }
    return DeliverChunk(*raw, held.get(), device.get(), cb, r.getFetchChunk(), at);
  });
  if (!reply.ok() && cancelled_skip) return true;
  if (!reply.ok()) {
    // Only a fetch that delivered nothing may be retried.
    if (streamed && reply.status().IsUnavailable()) return Status::Aborted(reply.status().message());
    return reply.status();
  }
  if (t.model != nullptr && !seen->seen) return Status::Corruption("daemon ended a fetch by query without its hit");
  return true;
}

}  // namespace

Status Client::Fetch(std::uint64_t entry, std::span<const std::uint32_t> layers, const FetchCallbacks& cb) {
  FetchTarget t;
  t.entry = entry;
  HitSeen seen;
  return impl_->Retry([&] { return FetchOnce(*impl_, t, layers, cb, &seen); }).status();
}

Result<std::optional<LookupHit>> Client::LookupAndFetch(const ModelId& model, std::span<const std::uint32_t> tokens,
                                                        const FetchCallbacks& cb, std::uint64_t* shared_tokens) {
  if (!server_info().fetch_by_query) {
    PC_ASSIGN_OR_RETURN(std::optional<LookupHit> hit, Lookup(model, tokens, shared_tokens));
    if (!hit) return hit;
    if (cb.on_hit) PC_RETURN_IF_ERROR(cb.on_hit(*hit));
    if (cb.skip_parted_hits && hit->ranks > 1) return hit;
    PC_RETURN_IF_ERROR(Fetch(hit->id, {}, cb));
    return hit;
  }
  FetchTarget t;
  t.model = &model;
  t.tokens = tokens;
  t.want_shared = shared_tokens != nullptr;
  t.skip_parted_hits = cb.skip_parted_hits;
  HitSeen seen;
  PC_RETURN_IF_ERROR(impl_->Retry([&] { return FetchOnce(*impl_, t, {}, cb, &seen); }).status());
  if (shared_tokens != nullptr) {
    // As Lookup's: at least the hit's length, at most the query's.
    *shared_tokens = std::clamp<std::uint64_t>(seen.shared_tokens, seen.hit ? seen.hit->length : 0, tokens.size());
  }
  return seen.hit;
}

Result<std::vector<FetchedLayer>> Client::FetchLayers(std::uint64_t entry, std::span<const std::uint32_t> layers) {
  std::vector<FetchedLayer> out;
  FetchCallbacks cb;
  cb.on_layer = [&](std::uint32_t layer, std::span<const std::byte> header, std::uint32_t chunks) {
    FetchedLayer f;
    f.layer = layer;
    f.data.header.assign(header.begin(), header.end());
    f.data.chunks.reserve(chunks);
    out.push_back(std::move(f));
    return Status::Ok();
  };
  cb.on_chunk = [&](std::uint32_t layer, std::uint32_t, std::span<const std::byte> bytes) {
    if (out.empty() || out.back().layer != layer) return Status::Corruption("chunk of a layer that was not announced");
    out.back().data.chunks.emplace_back(bytes.begin(), bytes.end());
    return Status::Ok();
  };
  // A fetch cut off mid-stream starts over: what it delivered is dropped.
  return impl_->Retry(
      [&]() -> Result<std::vector<FetchedLayer>> {
        out.clear();
        PC_RETURN_IF_ERROR(Fetch(entry, layers, cb));
        return std::move(out);
      },
      StatusCode::kAborted);
}

std::future<Result<std::vector<FetchedLayer>>> Client::FetchLayersAsync(std::uint64_t entry,
                                                                        std::vector<std::uint32_t> layers) {
  return std::async(std::launch::async, [this, entry, layers = std::move(layers)] { return FetchLayers(entry, layers); });
}

}  // namespace primecache::client
