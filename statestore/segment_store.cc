// The store's segment files: the pool of writable segments, the table of
// segment files open for reading, recovery at open, and reading an extent.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "statestore/kill_point.h"
#include "statestore/rocks_env.h"
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

// ---- the pool of writable segments -----------------------------------------------------

Result<std::unique_ptr<SegmentWriter>> LocalStore::Impl::AcquireWriter() {
  {
    MutexLock g(&pool_mu);
    if (!idle_writers.empty()) {
      auto w = std::move(idle_writers.back());
      idle_writers.pop_back();
      busy_segments.insert(w->id());
      return w;
    }
  }
  const std::uint64_t id = next_segment.fetch_add(1);
  {
    MutexLock g(&pool_mu);
    busy_segments.insert(id);
  }
  auto w = SegmentWriter::Create(env, seg_dir, id, freeze);
  if (!w.ok()) {
    MutexLock g(&pool_mu);
    busy_segments.erase(id);
  }
  return w;
}

void LocalStore::Impl::ReleaseWriter(std::unique_ptr<SegmentWriter> w, bool reuse) {
  if (w == nullptr) return;
  bool sealed = false;
  if (!w->fresh()) {
    MutexLock wl(&write_mu);
    auto it = segments.find(w->id());
    sealed = it == segments.end() || it->second.state == SegmentState::kSealed;
  }
  // A segment never committed has no record: it is reused, or (closed) its
  // file is removed by the next open.
  MutexLock g(&pool_mu);
  busy_segments.erase(w->id());
  if (reuse && !w->broken() && !sealed && !opts.read_only) {
    idle_writers.push_back(std::move(w));
    return;
  }
  Status s = w->Close();
  if (!s.ok()) spdlog::warn("statestore {}: closing segment {}: {}", path, SegmentHex(w->id()), s.ToString());
}

void LocalStore::Impl::CloseIdleWriters() {
  std::vector<std::unique_ptr<SegmentWriter>> idle;
  {
    MutexLock g(&pool_mu);
    idle.swap(idle_writers);
  }
  for (auto& w : idle) {
    Status s = w->Close();
    if (!s.ok()) spdlog::warn("statestore {}: closing segment {}: {}", path, SegmentHex(w->id()), s.ToString());
  }
}

// ---- files open for reading -------------------------------------------------------------

Result<std::shared_ptr<RandomAccessFile>> LocalStore::Impl::SegmentFile(std::uint64_t id) {
  MutexLock g(&files_mu);
  if (auto d = damaged_segments.find(id); d != damaged_segments.end()) {
    return Status::Corruption("segment " + SegmentHex(id) + ": " + d->second);
  }
  if (auto it = open_files.find(id); it != open_files.end()) return it->second;
  const std::string file = seg_dir + "/" + SegmentFileName(id);
  auto f = opts.direct_reads ? env->NewDirectRandomAccessFile(file) : env->NewRandomAccessFile(file);
  if (!f.ok()) {
    return Status::Corruption("segment " + SegmentHex(id) + " (" + file +
                              ") cannot be opened: " + f.status().ToString());
  }
  std::shared_ptr<RandomAccessFile> shared(std::move(f).value());
  open_files.emplace(id, shared);
  return shared;
}

void LocalStore::Impl::ForgetSegmentFile(std::uint64_t id) {
  std::optional<std::uint64_t> mapping;
  {
    MutexLock g(&files_mu);
    open_files.erase(id);
    if (auto it = mappings.find(id); it != mappings.end()) mapping = it->second.id;
    mappings.erase(id);
  }
  if (mapping) {
    MutexLock g(&checked_mu);
    if (auto it = checked_pinned.find(*mapping); it != checked_pinned.end()) {
      checked_pinned_count -= it->second.size();
      checked_pinned.erase(it);
    }
  }
}

bool LocalStore::Impl::CheckedWhilePinned(std::uint64_t mapping, std::uint64_t offset, std::uint64_t pin) {
  if (pin == 0) return false;
  MutexLock g(&checked_mu);
  auto m = checked_pinned.find(mapping);
  if (m == checked_pinned.end()) return false;
  auto c = m->second.find(offset);
  return c != m->second.end() && c->second == pin;
}

void LocalStore::Impl::NoteCheckedWhilePinned(std::uint64_t mapping, std::uint64_t offset, std::uint64_t pin) {
  constexpr std::size_t kMaxChecked = 1u << 20;
  if (pin == 0) return;
  MutexLock g(&checked_mu);
  if (checked_pinned_count >= kMaxChecked) {
    checked_pinned.clear();
    checked_pinned_count = 0;
  }
  auto [it, fresh] = checked_pinned[mapping].insert_or_assign(offset, pin);
  (void)it;
  if (fresh) ++checked_pinned_count;
}

Result<MappedRegion> LocalStore::Impl::SegmentMapping(std::uint64_t id, const RandomAccessFile& file,
                                                 std::uint64_t end) {
  {
    MutexLock g(&files_mu);
    if (auto it = mappings.find(id); it != mappings.end() && it->second.size >= end) return it->second;
  }
  // Only the committed length is mapped: bytes past it belong to a publish
  // in flight, which an abort cuts off (a mapped page past the end of a file
  // faults when touched, and registering a mapping touches every page).
  std::uint64_t committed = end;
  {
    MutexLock wl(&write_mu);
    if (auto it = segments.find(id); it != segments.end()) committed = std::max(end, it->second.committed);
  }
  PC_ASSIGN_OR_RETURN(std::uint64_t size, env->GetFileSize(seg_dir + "/" + SegmentFileName(id)));
  if (size < committed) {
    return Status::Corruption("segment " + SegmentHex(id) + " holds " + std::to_string(size) +
                              " bytes, short of its committed " + std::to_string(committed));
  }
  PC_ASSIGN_OR_RETURN(MappedRegion m, file.Map(committed));
  MutexLock g(&files_mu);
  // A longer mapping of a segment that grew maps the same file: it keeps
  // the shorter one's `file`, so that a device registration budget counts
  // the file once.
  auto& kept = mappings[id];
  m.file = kept.file != 0 ? kept.file : NextMappingId();
  kept = m;
  return m;
}

Status LocalStore::Impl::ReadExtent(const std::shared_ptr<RandomAccessFile>& file, const Extent& e, const Hash128& h,
                               std::span<std::byte> dst) {
  std::size_t n = 0;
  Status s = ReadAt(*file, e.offset, dst, &n);
  const std::string where = "chunk " + HashHex(h) + " in segment " + SegmentHex(e.segment) + " at offset " +
                            std::to_string(e.offset);
  if (!s.ok()) return s.WithContext("read " + where);
  if (n != dst.size()) {
    return Status::Corruption(where + ": the file ends " + std::to_string(dst.size() - n) +
                              " bytes early (truncated behind the store's back?)");
  }
  return CheckAddress(dst, h, e);
}

Status LocalStore::Impl::CheckAddress(std::span<const std::byte> bytes, const Hash128& h, const Extent& e) {
  if (Checksum128(bytes) == h) return Status::Ok();
  return Status::Corruption("chunk " + HashHex(h) + " in segment " + SegmentHex(e.segment) + " at offset " +
                            std::to_string(e.offset) + ": content does not match its address (XXH3-128)");
}

Status LocalStore::Impl::LocateChunks(const std::vector<Hash128>& hashes, std::vector<Located>* out) {
  const std::size_t n = hashes.size();
  out->assign(n, Located{});
  std::vector<std::string> keys(n);
  std::vector<rocksdb::Slice> slices(n);
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = HashKey(hashes[i]);
    slices[i] = keys[i];
  }
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  // Extents and files are resolved together, so that gc (which repoints
  // and drops a file under the exclusive lock) never moves bytes under us.
  ReaderLock g(&extent_mu);
  if (n > 0) db->MultiGet(rocksdb::ReadOptions(), cf_chunk_refs, n, slices.data(), values.data(), statuses.data());
  // Chunks of one entry mostly lie in one segment: its file is asked for once.
  std::uint64_t last_segment = 0;
  std::shared_ptr<RandomAccessFile> last_file;
  for (std::size_t i = 0; i < n; ++i) {
    Located& l = (*out)[i];
    auto name = [&] { return "chunk " + HashHex(hashes[i]); };  // made for errors only, not for every chunk
    if (statuses[i].IsNotFound()) {
      l.status = Status::Corruption(name() + " has no reference record");
      continue;
    }
    PC_RETURN_IF_ERROR(FromRocks(statuses[i], "read chunk references"));
    auto r = DecodeChunkRef(values[i].ToStringView());
    if (!r.ok()) {
      l.status = r.status().WithContext(name());
    } else if (!r->placed) {
      l.status = Status::Corruption(name() + " was never migrated to a segment");
    } else if (r->segment == 0) {
      l.status = Status::Corruption(name() + " has no bytes (lost; marked corrupt)");
    } else {
      l.extent = Extent{r->segment, r->offset};
      if (last_file == nullptr || last_segment != r->segment) {
        auto f = SegmentFile(r->segment);
        if (!f.ok()) {
          l.status = f.status().WithContext(name());
          continue;
        }
        last_segment = r->segment;
        last_file = std::move(f).value();
      }
      l.file = last_file;
    }
  }
  return Status::Ok();
}

// ---- open and recovery -----------------------------------------------------------------------

Status LocalStore::Impl::LoadSegments() {
  segments.clear();
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf_segments));
  std::uint64_t top = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    PC_ASSIGN_OR_RETURN(std::uint64_t id, IdFromKey(it->key().ToStringView()));
    PC_ASSIGN_OR_RETURN(SegmentRecord rec, DecodeSegment(it->value().ToStringView()));
    if (id == 0) return Status::Corruption("a segment record of id 0");
    segments[id] = rec;
    top = std::max(top, id);
  }
  PC_RETURN_IF_ERROR(FromRocks(it->status(), "load segment records"));
  next_segment = std::max(next_segment.load(), top + 1);
  return Status::Ok();
}

namespace {

// What is wrong with a recorded segment's file, or "" when it is whole.
std::string CheckRecordedFile(Env* env, const std::string& file, const SegmentRecord& rec, std::uint64_t id,
                              std::uint64_t* size) {
  auto sz = env->GetFileSize(file);
  if (!sz.ok()) return "its file " + file + " is missing";
  *size = *sz;
  if (*sz < rec.committed) {
    return "its file " + file + " holds " + std::to_string(*sz) + " bytes, fewer than the " +
           std::to_string(rec.committed) + " committed";
  }
  auto f = env->NewRandomAccessFile(file);
  std::string header(kSegmentHeaderBytes, '\0');
  std::size_t n = 0;
  Status s = f.ok() ? (*f)->Read(0, std::as_writable_bytes(std::span(header.data(), header.size())), &n)
                    : f.status();
  if (s.ok() && n == header.size()) s = CheckSegmentHeader(header, id);
  if (!s.ok() || n != header.size()) return "its header is unreadable: " + s.ToString();
  return "";
}

}  // namespace

// Segment files against their records: an unrecorded file (created by a
// publish that never committed) is deleted, a tail past the committed
// length cut, a missing or short file noted as damaged (every fetch that
// needs it fails with kCorruption and quarantines its entry). Read-only,
// nothing is changed. Open segments go back to the pool.
Status LocalStore::Impl::RecoverSegments() {
  std::vector<std::string> names;
  if (env->FileExists(seg_dir)) {
    PC_ASSIGN_OR_RETURN(names, env->GetChildren(seg_dir));
  }
  std::set<std::uint64_t> on_disk;
  for (const std::string& name : names) {
    auto id = SegmentIdFromName(name);
    if (!id) continue;
    next_segment = std::max(next_segment.load(), *id + 1);
    if (segments.count(*id) != 0) {
      on_disk.insert(*id);
    } else if (!opts.read_only) {
      spdlog::info("statestore {}: removing segment {}, which no commit recorded", path, name);
      PC_RETURN_IF_ERROR(env->RemoveFile(seg_dir + "/" + name));
    }
  }
  for (const auto& [id, rec] : segments) {
    const std::string file = seg_dir + "/" + SegmentFileName(id);
    std::uint64_t size = 0;
    std::string wrong = on_disk.count(id) != 0 ? CheckRecordedFile(env, file, rec, id, &size)
                                               : "its file " + file + " is missing";
    if (!wrong.empty()) {
      spdlog::error("statestore {}: segment {}: {}; the entries that need it will be quarantined", path,
                    SegmentHex(id), wrong);
      MutexLock g(&files_mu);
      damaged_segments[id] = wrong;
      continue;
    }
    if (opts.read_only) continue;
    if (size > rec.committed) {
      spdlog::info("statestore {}: cutting the {} uncommitted bytes at the end of segment {}", path,
                   size - rec.committed, SegmentHex(id));
      PC_RETURN_IF_ERROR(env->TruncateFile(file, rec.committed));
    }
    if (rec.state == SegmentState::kOpen) {
      PC_ASSIGN_OR_RETURN(auto w, SegmentWriter::Reopen(env, seg_dir, id, rec.committed, freeze));
      if (size > rec.committed) PC_RETURN_IF_ERROR(w->Sync());  // the cut made durable
      MutexLock g(&pool_mu);
      idle_writers.push_back(std::move(w));
    }
  }
  return Status::Ok();
}

Result<std::uint64_t> LocalStore::Impl::SegmentDiskBytes() {
  std::uint64_t total = 0;
  if (!env->FileExists(seg_dir)) return total;
  PC_ASSIGN_OR_RETURN(auto names, env->GetChildren(seg_dir));
  for (const std::string& name : names) {
    if (auto size = env->GetFileSize(seg_dir + "/" + name); size.ok()) total += *size;
  }
  return total;
}

}  // namespace primecache
