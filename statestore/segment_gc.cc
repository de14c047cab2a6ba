// Segment gc: the space of dead chunks (removed, evicted, aborted, or the
// losing copy of two publishes of one new chunk) comes back by rewriting
// segments. A segment's live chunks are copied, each checked against its
// address, into a new segment, which is synced; one batch then repoints
// their records and replaces the segment records; the old file is unlinked
// last. A crash before the batch leaves an unrecorded new file (deleted at
// open); after it, an unrecorded old file (deleted at open too). A batch
// whose write fails may still be in the WAL, so then both files stay for the
// open to tell which one is unrecorded.
#include <spdlog/spdlog.h>

#include "statestore/kill_point.h"
#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

namespace {

// One live chunk found in the segment being rewritten.
struct Moved {
  Hash128 hash;
  std::uint64_t size = 0;
  Extent from, to;  // to.segment == 0: its bytes failed their address check
};

bool WorthRewriting(const SegmentRecord& rec, bool all) {
  if (rec.committed < kSegmentHeaderBytes || rec.live > rec.committed - kSegmentHeaderBytes) return false;
  const std::uint64_t dead = rec.committed - kSegmentHeaderBytes - rec.live;
  if (rec.live == 0) return true;
  return all ? dead > 0 : dead >= rec.live;
}

}  // namespace

Status LocalStore::Impl::CollectSegments(bool all) {
  MutexLock gc(&gc_mu);
  Status cut = CutAbortedTails();
  std::vector<std::pair<std::uint64_t, SegmentRecord>> todo;
  std::vector<std::unique_ptr<SegmentWriter>> closing;
  {
    MutexLock wl(&write_mu);
    MutexLock pl(&pool_mu);
    // Idle writable segments worth rewriting leave the pool first.
    for (auto it = idle_writers.begin(); it != idle_writers.end();) {
      auto rec = segments.find((*it)->id());
      if (rec != segments.end() && WorthRewriting(rec->second, all)) {
        closing.push_back(std::move(*it));
        it = idle_writers.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [id, rec] : segments) {
      if (busy_segments.count(id) != 0) continue;
      bool idle = false;
      for (const auto& w : idle_writers) idle |= w->id() == id;
      if (!idle && WorthRewriting(rec, all)) todo.emplace_back(id, rec);
    }
  }
  for (auto& w : closing) (void)w->Close();
  Status first = cut;
  for (const auto& [id, rec] : todo) {
    if (gc_cancel.load()) break;
    Status s = rec.live == 0 ? DropDeadSegment(id) : RewriteSegment(id, rec);
    if (!s.ok()) {
      spdlog::warn("statestore {}: rewriting segment {}: {}", path, SegmentHex(id), s.ToString());
      if (first.ok()) first = s;
    }
  }
  return first;
}

// No writer holds these segments (they were closed broken): only gc and
// open touch their files.
Status LocalStore::Impl::CutAbortedTails() {
  std::map<std::uint64_t, std::uint64_t> todo;
  {
    MutexLock g(&pool_mu);
    todo = uncut_tails;
  }
  Status first;
  for (const auto& [id, keep] : todo) {
    const std::string file = seg_dir + "/" + SegmentFileName(id);
    Status s;
    if (keep == 0) {
      s = env->RemoveFile(file);  // never recorded: nothing in it is anyone's
      if (!s.ok() && !env->FileExists(file)) s = Status::Ok();
    } else {
      auto size = env->GetFileSize(file);
      s = size.status();
      if (s.ok() && *size > keep) s = env->TruncateFile(file, keep);
    }
    if (!s.ok()) {
      if (first.ok()) first = s.WithContext("cut the tail of aborted publishes in segment " + SegmentHex(id));
      continue;
    }
    spdlog::info("statestore {}: cut the tail an aborted publish left in segment {}", path, SegmentHex(id));
    MutexLock g(&pool_mu);
    uncut_tails.erase(id);
  }
  return first;
}

Status LocalStore::Impl::DropDeadSegment(std::uint64_t id) {
  {
    MutexLock wl(&write_mu);
    auto it = segments.find(id);
    if (it == segments.end() || it->second.live != 0) return Status::Ok();  // changed meanwhile
    Txn t(*this);
    t.DropSegment(id);
    MutexLock ex(&extent_mu);
    PC_RETURN_IF_ERROR(t.Commit(CommitWriteOptions(), "gc.before_batch", "gc.after_batch"));
    ForgetSegmentFile(id);
  }
  return UnlinkSegment(id);
}

Status LocalStore::Impl::UnlinkSegment(std::uint64_t id) {
  TEST_KILL_POINT("gc.before_unlink");
  const std::string file = seg_dir + "/" + SegmentFileName(id);
  Status s = env->RemoveFile(file);
  if (!s.ok() && env->FileExists(file)) return s.WithContext("unlink segment");  // removed at the next open
  return Status::Ok();
}

namespace {

// Copies the live chunks of segment `id` (those whose record still points at
// them) to `w`. A frame that cannot be parsed ends the rewrite (nothing is
// changed); a live chunk whose bytes fail their address is noted lost.
Status CopyLive(LocalStore::Impl& s, std::uint64_t id, const SegmentRecord& rec, SegmentWriter& w,
                std::vector<Moved>* moved) {
  PC_ASSIGN_OR_RETURN(auto file, s.SegmentFile(id));
  std::string header(kFrameHeaderBytes, '\0');
  std::vector<std::byte> buf;
  for (std::uint64_t off = kSegmentHeaderBytes; off < rec.committed;) {
    if (s.gc_cancel.load()) return Status::Aborted("the store is closing");
    std::size_t n = 0;
    PC_RETURN_IF_ERROR(ReadAt(*file, off, std::as_writable_bytes(std::span(header.data(), header.size())), &n));
    if (n != header.size()) return Status::Corruption("segment " + SegmentHex(id) + " ends inside a frame header");
    auto f = DecodeFrameHeader(header, StoreLimits::kMaxChunkBytes);
    if (!f.ok()) return f.status().WithContext("segment " + SegmentHex(id) + " at offset " + std::to_string(off));
    const std::uint64_t at = off + kFrameHeaderBytes;
    if (f->size > rec.committed - at) return Status::Corruption("segment " + SegmentHex(id) + ": a frame runs past its end");
    off = at + f->size;
    std::string v;
    bool found = false;
    PC_RETURN_IF_ERROR(s.GetValue(s.cf_chunk_refs, HashKey(f->hash), &v, &found));
    auto r = found ? DecodeChunkRef(v) : Result<ChunkRefRecord>(Status::NotFound(""));
    if (!r.ok() || r->refs == 0 || r->segment != id || r->offset != at) continue;  // dead
    Moved m{f->hash, f->size, {id, at}, {}};
    buf.resize(f->size);
    Status rs = s.ReadExtent(file, m.from, f->hash, buf);
    if (rs.IsCorruption()) {
      spdlog::error("statestore {}: gc: {}; its entries will be quarantined when read", s.path, rs.ToString());
      moved->push_back(m);
      continue;
    }
    PC_RETURN_IF_ERROR(rs);
    TEST_KILL_POINT("gc.copy");
    PC_ASSIGN_OR_RETURN(std::uint64_t to, w.Append(f->hash, buf));
    m.to = Extent{w.id(), to};
    moved->push_back(m);
  }
  return Status::Ok();
}

// One batch: the new segment recorded, every moved chunk repointed, the old
// segment's record dropped. Refused (nothing changes) when the old segment
// gained a chunk meanwhile. *attempted is set once the batch's write begins:
// from there a failure may still have left it in the WAL (a write that
// reached the log and then failed its sync), so neither file may go.
Status CommitRewrite(LocalStore::Impl& s, std::uint64_t id, SegmentWriter& w, const std::vector<Moved>& moved,
                     bool* attempted) {
  MutexLock wl(&s.write_mu);
  auto cur = s.segments.find(id);
  if (cur == s.segments.end()) return Status::Aborted("segment dropped meanwhile");
  Txn t(s);
  t.SetSegment(w.id(), w.end(), SegmentState::kSealed);
  std::uint64_t leaving = 0;
  for (const Moved& m : moved) {
    bool ok = false;
    PC_RETURN_IF_ERROR(t.Repoint(m.hash, m.from, m.to, &ok));
    if (ok) leaving += FrameBytes(m.size);
  }
  if (leaving != cur->second.live) {
    return Status::Aborted("segment " + SegmentHex(id) + " changed while it was rewritten; left for the next gc");
  }
  t.DropSegment(id);
  MutexLock ex(&s.extent_mu);
  *attempted = true;
  PC_RETURN_IF_ERROR(t.Commit(s.CommitWriteOptions(), "gc.before_batch", "gc.after_batch"));
  s.ForgetSegmentFile(id);
  w.MarkCommitted();
  return Status::Ok();
}

}  // namespace

Status LocalStore::Impl::RewriteSegment(std::uint64_t id, const SegmentRecord& rec) {
  const std::uint64_t new_id = next_segment.fetch_add(1);
  PC_ASSIGN_OR_RETURN(auto w, SegmentWriter::Create(env, seg_dir, new_id, freeze));
  std::vector<Moved> moved;
  bool attempted = false;
  Status s = CopyLive(*this, id, rec, *w, &moved);
  if (s.ok()) s = w->Sync();
  if (s.ok()) s = CommitRewrite(*this, id, *w, moved, &attempted);
  (void)w->Close();
  if (!s.ok()) {
    // Before the batch nothing points at the new file: it goes. After a
    // failed batch either file may be the recorded one: both stay, and the
    // next open removes whichever is unrecorded.
    if (!attempted) (void)env->RemoveFile(seg_dir + "/" + SegmentFileName(new_id));
    return s;
  }
  spdlog::debug("statestore {}: segment {} rewritten as {} ({} live chunks)", path, SegmentHex(id),
                SegmentHex(new_id), moved.size());
  return UnlinkSegment(id);
}

}  // namespace primecache
