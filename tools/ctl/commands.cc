// ls, show, rm, gc, export, import, compact (verify: verify.cc; stats: stats.cc).
#include "tools/ctl/commands.h"
#include "tools/ctl/entry_view.h"

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <map>
#include <optional>
#include <variant>

#include "primecache/internal/codec.h"
#include "primecache/internal/env.h"
#include "primecache/internal/shard.h"
#include "primecache/internal/snapshot.h"
#include "primecache/internal/snapshot_file.h"

namespace primecache::ctl {

namespace {

std::uint64_t NowUnixMs() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

std::string AgeOf(const EntryInfo& e, std::uint64_t now_ms);

// One entry as `ls --json` and `show --json` give it (docs/cli.md).
nlohmann::json EntryJson(const EntryInfo& e, std::uint64_t now_ms) {
  nlohmann::json j = {{"id", e.id},
                      {"state", e.quarantined() ? "quarantined" : "live"},
                      {"model", {{"name", e.model_name}, {"digest", HexDigits(e.model)}}},
                      {"namespace", e.ns},
                      {"length", e.length},
                      {"layers", e.layers},
                      {"ranks", e.ranks},
                      {"stored_bytes", e.chunk_bytes},
                      {"raw_bytes", e.raw_bytes},
                      {"created_unix_ms", e.created_unix_ms},
                      {"age_seconds", now_ms > e.created_unix_ms ? (now_ms - e.created_unix_ms) / 1000 : 0},
                      {"hits", e.hits},
                      {"last_access", e.last_access},
                      {"exportable", !e.model_descriptor.empty()}};
  if (e.quarantined()) j["reason"] = e.reason;
  return j;
}

// The store refuses to remove a leased entry (a fetch is reading it) with
// kUnavailable, as it does a lost connection; for the exit status it is a
// refusal, not an absent daemon.
Status InUseAsRefusal(const Status& s) {
  if (s.IsUnavailable() && s.message().find("leased") != std::string::npos) {
    return Status::FailedPrecondition(s.message());
  }
  return s;
}

}  // namespace

std::string NamespaceLabel(const std::string& ns) {
  return ns.empty() ? "(default)" : ns;
}

bool Matches(const EntryInfo& e, const LsOptions& o) {
  if (!o.model.empty() && e.model_name != o.model && !HexPrefixMatches(e.model, o.model)) return false;
  if (o.ns.has_value() && e.ns != *o.ns) return false;
  return e.length >= o.min_length;
}

void SortEntries(std::vector<EntryInfo>& v, const std::string& key, bool reverse) {
  auto value = [&](const EntryInfo& e) -> std::uint64_t {
    if (key == "age") return ~e.created_unix_ms;  // oldest first
    if (key == "size") return e.chunk_bytes;
    if (key == "raw") return e.raw_bytes;
    if (key == "length") return e.length;
    if (key == "layers") return e.layers;
    if (key == "hits") return e.hits;
    if (key == "recent") return ~e.last_access;  // most recently used first
    return e.id;
  };
  std::stable_sort(v.begin(), v.end(), [&](const EntryInfo& a, const EntryInfo& b) {
    const std::uint64_t x = value(a), y = value(b);
    if (x != y) return reverse ? x > y : x < y;
    return reverse ? a.id > b.id : a.id < b.id;
  });
}

namespace {

std::string AgeOf(const EntryInfo& e, std::uint64_t now_ms) {
  return HumanAge(now_ms > e.created_unix_ms ? (now_ms - e.created_unix_ms) / 1000 : 0);
}

}  // namespace


// ---- ls ---------------------------------------------------------------------------------

int Ls(Target& access, const LsOptions& o, const Output& out) {
  auto all = ListAll(*access.store, o.quarantined ? EntryState::kQuarantined : EntryState::kLive);
  if (!all.ok()) return out.Error(all.status());
  std::vector<EntryInfo> entries;
  for (auto& e : *all) {
    if (Matches(e, o)) entries.push_back(std::move(e));
  }
  SortEntries(entries, o.sort, o.reverse);
  if (o.limit > 0 && entries.size() > o.limit) entries.resize(o.limit);
  const std::uint64_t now = NowUnixMs();
  if (out.json()) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& e : entries) list.push_back(EntryJson(e, now));
    out.Json({{"source", access.where}, {"entries", list}});
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  std::uint64_t stored = 0, raw = 0;
  for (const auto& e : entries) {
    std::vector<std::string> row = {std::to_string(e.id),
                                    e.model_name,
                                    HexDigits(e.model).substr(0, 12),
                                    NamespaceLabel(e.ns),
                                    std::to_string(e.length),
                                    std::to_string(e.layers),
                                    HumanBytes(e.chunk_bytes),
                                    HumanBytes(e.raw_bytes),
                                    AgeOf(e, now)};
    if (o.quarantined) {
      row.push_back(e.reason);
    } else {
      row.push_back(std::to_string(e.hits));
    }
    rows.push_back(std::move(row));
    stored += e.chunk_bytes;
    raw += e.raw_bytes;
  }
  std::vector<std::string> header = {">ID",     "MODEL",   "FINGERPRINT", "NAMESPACE", ">LENGTH",
                                     ">LAYERS", ">STORED", ">RAW",        ">AGE"};
  header.push_back(o.quarantined ? "REASON" : ">HITS");
  out.Line(RenderTable(header, rows));
  out.Line(std::to_string(entries.size()) + (o.quarantined ? " quarantined" : "") + " entries, " +
           HumanBytes(stored) + " stored (shared chunks counted in each), " + HumanBytes(raw) + " raw; " +
           access.where);
  return kExitOk;
}

// ---- show ---------------------------------------------------------------------------------


namespace {


// `show` without --json: the entry's lines, then its layers as a table.
void ShowText(const EntryInfo& e, const nlohmann::json& fingerprint, const std::string& fp_problem,
              const std::string& text, const std::vector<std::vector<std::string>>& rows, const Output& out) {
  out.Line("entry " + std::to_string(e.id) + (e.quarantined() ? "  QUARANTINED: " + e.reason : ""));
  out.Line("  model      " + e.model_name + "  " + HexDigits(e.model));
  if (!fingerprint.is_null()) {
    std::string versions;
    for (const auto& v : fingerprint["codec_versions"]) versions += (versions.empty() ? "" : ", ") + v.get<std::string>();
    out.Line("  plan       " + fingerprint["plan_digest"].get<std::string>());
    out.Line("  weights    " + fingerprint["weights_digest"].get<std::string>());
    out.Line("  codecs     " + versions);
  } else {
    out.Line("  (no model descriptor stored" + (fp_problem.empty() ? "" : ": " + fp_problem) +
             "; the entry cannot be exported)");
  }
  out.Line("  namespace  " + NamespaceLabel(e.ns));
  out.Line("  boundary   " + std::to_string(e.length) + " tokens, " + std::to_string(e.layers) + " layers");
  if (e.ranks > 1) out.Line("  ranks      " + std::to_string(e.ranks) + " (tensor-parallel; each layer's part below)");
  out.Line("  size       " + HumanBytes(e.chunk_bytes) + " stored, " + HumanBytes(e.raw_bytes) + " raw");
  out.Line("  age        " + AgeOf(e, NowUnixMs()) + ", " + std::to_string(e.hits) + " hits");
  if (!e.quarantined()) out.Line("  text       " + text);
  if (!rows.empty()) {
    out.Line("");
    out.Line(RenderTable(ShownLayerColumns(), rows));
  }
}

}  // namespace

int Show(Target& access, std::uint64_t id, std::size_t text_chars, const Output& out) {
  DescribeOptions with_headers;
  with_headers.layer_headers = true;
  auto detail = access.store->Describe(id, with_headers);
  if (!detail.ok()) return out.Error(detail.status());
  const EntryInfo* e = &detail->info;
  const std::vector<std::string>& headers = detail->layer_headers;
  bool shortened = false;
  const std::string text = TokensAsText(e->tokens, text_chars, &shortened);
  std::string fp_problem;
  const nlohmann::json fingerprint = FingerprintJson(*e, &fp_problem);

  nlohmann::json layers = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> problems;
  const std::vector<std::optional<EntryLayerPart>> parts = LayerParts(*e, headers, &problems);
  for (std::size_t i = 0; i < headers.size(); ++i) {
    ShownLayer layer = ShowLayer(i, headers[i]);
    if (parts[i]) {
      const EntryLayerPart& p = *parts[i];
      layer.json["part"] = {{"model_layer", p.model_layer}, {"rank", p.rank}, {"shard", p.shard}};
      // The layer column says which part this is: "3 (L1 r2)", "0 (L0 replicated)".
      layer.row[0] += " (L" + std::to_string(p.model_layer) +
                      (p.shard ? " r" + std::to_string(p.rank) : std::string(" replicated")) + ")";
    }
    layers.push_back(std::move(layer.json));
    rows.push_back(std::move(layer.row));
    if (!layer.problem.empty()) problems.push_back(std::move(layer.problem));
  }
  if (out.json()) {
    nlohmann::json doc = {{"entry", EntryJson(*e, NowUnixMs())},
                          {"tokens", {{"count", e->tokens.size()}, {"text", text}, {"shortened", shortened}}},
                          {"fingerprint", fingerprint},
                          {"layers", layers}};
    if (!fp_problem.empty()) doc["fingerprint_error"] = fp_problem;
    out.Json(doc);
  } else {
    ShowText(*e, fingerprint, fp_problem, text, rows, out);
  }
  for (const auto& p : problems) out.Note(p);
  return problems.empty() ? kExitOk : kExitDamage;
}

// ---- rm ---------------------------------------------------------------------------------

int Rm(Target& access, const std::vector<std::uint64_t>& ids, const Output& out) {
  nlohmann::json removed = nlohmann::json::array();
  nlohmann::json failed = nlohmann::json::array();
  int code = kExitOk;
  for (std::uint64_t id : ids) {
    Status s = access.writable() ? access.store->Delete(id) : access.ReadOnly("rm");
    if (s.ok()) {
      removed.push_back(id);
      out.Line("removed entry " + std::to_string(id));
      continue;
    }
    s = InUseAsRefusal(s);
    if (code == kExitOk) code = ExitCodeFor(s);
    failed.push_back({{"id", id}, {"error", s.message()}});
    out.Note(s.ToString());
  }
  out.Json({{"removed", removed}, {"failed", failed}});
  return code;
}

// ---- gc ---------------------------------------------------------------------------------

// Compact, its running time shown on a terminal.
Status CompactShowingTime(Target& access, const Output& out, const char* what) {
  const ProgressTicker ticker(out, what);
  return access.writable() ? access.store->Compact() : access.ReadOnly("compact");
}

int Gc(Target& access, const GcOptions& o, const Output& out) {
  if (!access.writable() && !o.dry_run) {
    return out.Error(Status::FailedPrecondition("gc needs the running daemon (" + access.where +
                                                "); --dry-run shows what it would remove"));
  }
  auto before = StatOf(access);
  if (!before.ok()) return out.Error(before.status());
  struct Victim {
    EntryInfo e;
    std::string why;
  };
  std::vector<Victim> victims;
  auto quarantined = ListAll(*access.store, EntryState::kQuarantined);
  if (!quarantined.ok()) return out.Error(quarantined.status());
  for (auto& e : *quarantined) victims.push_back({e, "quarantined: " + e.reason});
  if (o.older_than_seconds.has_value()) {
    auto live = ListAll(*access.store, EntryState::kLive);
    if (!live.ok()) return out.Error(live.status());
    const std::uint64_t now = NowUnixMs();
    for (auto& e : *live) {
      if (now > e.created_unix_ms && (now - e.created_unix_ms) / 1000 >= *o.older_than_seconds) {
        victims.push_back({e, "created " + AgeOf(e, now) + " ago"});
      }
    }
  }
  nlohmann::json removed = nlohmann::json::array();
  nlohmann::json failed = nlohmann::json::array();
  std::uint64_t freed_logical = 0;
  int code = kExitOk;
  for (std::size_t i = 0; i < victims.size(); ++i) {
    const Victim& v = victims[i];
    out.Progress("gc", i, victims.size());
    Status s = o.dry_run ? Status::Ok() : InUseAsRefusal(access.store->Delete(v.e.id));
    if (s.IsNotFound()) continue;  // removed meanwhile
    if (!s.ok()) {
      if (code == kExitOk) code = ExitCodeFor(s);
      failed.push_back({{"id", v.e.id}, {"error", s.message()}});
      out.Note("entry " + std::to_string(v.e.id) + ": " + s.ToString());
      continue;
    }
    if (!v.e.quarantined()) freed_logical += v.e.chunk_bytes;
    removed.push_back({{"id", v.e.id}, {"why", v.why}, {"stored_bytes", v.e.chunk_bytes}});
    out.Line((o.dry_run ? "would remove entry " : "removed entry ") + std::to_string(v.e.id) + " (" + v.why + ")");
  }
  out.EndProgress();
  bool compacted = false;
  nlohmann::json compact_error = nullptr;
  if (!o.dry_run && o.compact) {
    Status s = CompactShowingTime(access, out, "gc: compacting");
    compacted = s.ok();
    if (!s.ok()) {
      if (code == kExitOk) code = ExitCodeFor(s);
      compact_error = s.message();
      out.Note("compact after gc: " + s.ToString());
    }
  }
  auto after = StatOf(access);
  if (!after.ok()) return out.Error(after.status());
  const std::uint64_t freed = before->store.stored_bytes > after->store.stored_bytes ? before->store.stored_bytes - after->store.stored_bytes : 0;
  out.Json({{"dry_run", o.dry_run},
            {"removed", removed},
            {"failed", failed},
            {"compacted", compacted},
            {"compact_error", compact_error},
            {"stored_bytes_before", before->store.stored_bytes},
            {"stored_bytes_after", after->store.stored_bytes},
            {"freed_stored_bytes", freed},
            {"disk_bytes_before", before->store.disk_bytes},
            {"disk_bytes_after", after->store.disk_bytes}});
  if (o.dry_run) {
    out.Line(std::to_string(victims.size()) + " entries would be removed (up to " + HumanBytes(freed_logical) +
             " of chunks, less what other entries share)");
  } else {
    out.Line("removed " + std::to_string(removed.size()) + " entries; stored " + HumanBytes(before->store.stored_bytes) +
             " -> " + HumanBytes(after->store.stored_bytes) + ", on disk " + HumanBytes(before->store.disk_bytes) + " -> " +
             HumanBytes(after->store.disk_bytes));
  }
  return code;
}

// ---- export / import / compact ------------------------------------------------------------

namespace {

// Stores a snapshot's layers under its fingerprint, in namespace `ns`.
Result<PublishResult> PublishSnapshot(Store& store, const EncodedSnapshot& snap, const std::string& ns) {
  const ModelFingerprint& fp = snap.header.fingerprint;
  PublishRequest request;
  request.model = fp.Digest();
  request.model_name = fp.architecture;
  request.model_descriptor = EncodeFingerprint(fp);
  request.ns = ns;
  request.tokens = snap.header.tokens;
  std::vector<LayerBytes> layers;
  layers.reserve(snap.layers.size());
  for (const EncodedLayer& l : snap.layers) layers.push_back({SerializeLayerHeader(l.header), l.chunks});
  return store.Publish(std::move(request), layers);
}

}  // namespace

int Export(Target& access, std::uint64_t id, const std::string& file, bool force, const Output& out) {
  Env* env = Env::Default();
  if (!force && env->FileExists(file)) {
    return out.Error(Status::FailedPrecondition(file + " exists; pass --force to replace it"));
  }
  auto detail = access.store->Describe(id);
  if (!detail.ok()) return out.Error(detail.status());
  const EntryInfo* e = &detail->info;
  if (e->quarantined()) return out.Error(Status::Corruption("entry " + std::to_string(id) + " is quarantined: " + e->reason));
  if (e->model_descriptor.empty()) {
    return out.Error(Status::FailedPrecondition(
        "entry " + std::to_string(id) +
        " was published without its model descriptor (an older client); it cannot be exported whole"));
  }
  auto fp = DecodeFingerprint(e->model_descriptor);
  if (!fp.ok()) return out.Error(fp.status().WithContext("entry " + std::to_string(id) + " model descriptor"));
  EncodedSnapshot snap;
  snap.header.fingerprint = std::move(fp).value();
  snap.header.ns = e->ns;
  snap.header.tokens = e->tokens;
  snap.header.boundary_len = e->tokens.size();
  FetchHandlers h;
  h.on_layer = [&](std::uint32_t layer, std::string_view header, std::uint32_t chunks) -> Status {
    if (layer != snap.layers.size()) return Status::Corruption("layer " + std::to_string(layer) + " out of order");
    auto parsed = ParseLayerHeader(AsBytes(header));
    if (!parsed.ok()) return parsed.status().WithContext("layer " + std::to_string(layer));
    snap.layers.push_back({std::move(parsed).value(), {}});
    snap.layers.back().chunks.reserve(chunks);
    out.Progress("export", layer, e->layers);
    return Status::Ok();
  };
  h.on_chunk = [&](std::uint32_t, std::uint32_t, std::span<const std::byte> bytes) -> Status {
    snap.layers.back().chunks.emplace_back(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return Status::Ok();
  };
  Status s = FetchWith(*access.store, id, h);
  out.EndProgress();
  if (!s.ok()) return out.Error(s.WithContext("export entry " + std::to_string(id)));
  s = WritePcsnap(env, file, snap);
  if (!s.ok()) return out.Error(s);
  auto size = env->GetFileSize(file);
  const std::uint64_t bytes = size.ok() ? *size : 0;
  out.Json({{"entry", id}, {"file", file}, {"bytes", bytes}, {"layers", snap.layers.size()}, {"tokens", e->tokens.size()}});
  out.Line("exported entry " + std::to_string(id) + " (" + std::to_string(snap.layers.size()) + " layers, " +
           std::to_string(e->tokens.size()) + " tokens) to " + file + ", " + HumanBytes(bytes));
  return kExitOk;
}

int Import(Target& access, const std::string& file, const std::optional<std::string>& ns, const Output& out) {
  if (!access.writable()) {
    return out.Error(Status::FailedPrecondition("import needs the running daemon (" + access.where + ")"));
  }
  auto snap = ReadPcsnap(Env::Default(), file);
  if (!snap.ok()) return out.Error(snap.status());  // it names the file
  // Every chunk decodes to what its header promises before anything is sent.
  auto decoded = DecodeSnapshot(*snap, {}, [&](std::size_t done, std::size_t total) {
    out.Progress("import: checking layers", done, total);
  });
  out.EndProgress();
  if (!decoded.ok()) return out.Error(decoded.status().WithContext(file));
  decoded = BoundarySnapshot{};  // checked; only the encoded bytes travel
  const std::string target = ns.value_or(snap->header.ns);
  auto r = [&] {
    const ProgressTicker ticker(out, "import: storing " + std::to_string(snap->layers.size()) + " layers");
    return PublishSnapshot(*access.store, *snap, target);
  }();
  if (!r.ok()) return out.Error(r.status().WithContext("import " + file));
  out.Json({{"file", file},
            {"entry", r->id},
            {"existed", r->existed},
            {"namespace", target},
            {"layers", snap->layers.size()},
            {"tokens", snap->header.tokens.size()}});
  out.Line((r->existed ? "already stored as entry " : "imported as entry ") + std::to_string(r->id) + " (" +
           std::to_string(snap->layers.size()) + " layers, " + std::to_string(snap->header.tokens.size()) +
           " tokens, namespace " + NamespaceLabel(target) + ")");
  return kExitOk;
}

int Compact(Target& access, const Output& out) {
  auto before = StatOf(access);
  if (!before.ok()) return out.Error(before.status());
  const auto start = std::chrono::steady_clock::now();
  Status s = CompactShowingTime(access, out, "compact");
  if (!s.ok()) return out.Error(s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto after = StatOf(access);
  if (!after.ok()) return out.Error(after.status());
  out.Json({{"disk_bytes_before", before->store.disk_bytes}, {"disk_bytes_after", after->store.disk_bytes}, {"seconds", seconds}});
  char took[32];
  std::snprintf(took, sizeof took, "%.2f s", seconds);
  out.Line("compacted in " + std::string(took) + "; on disk " + HumanBytes(before->store.disk_bytes) + " -> " +
           HumanBytes(after->store.disk_bytes));
  return kExitOk;
}

}  // namespace primecache::ctl
