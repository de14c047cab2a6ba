// verify: decodes and validates entries (every chunk against its content
// address and its encoded and raw checksums, every layer's shape against its
// planes and the boundary), cross-checks the store's records and reference
// counts (--all), or checks a .pcsnap file through and through (--file).
#include <optional>

#include "primecache/internal/codec.h"
#include "primecache/internal/env.h"
#include "primecache/internal/snapshot.h"
#include "primecache/internal/snapshot_file.h"
#include "tools/ctl/commands.h"
#include "tools/ctl/remote.h"

namespace primecache::ctl {

namespace {

struct Findings {
  std::uint64_t entries = 0, layers = 0, chunks = 0, bytes = 0;
  nlohmann::json problems = nlohmann::json::array();

  void Add(const std::string& where, const std::string& what) { problems.push_back({{"where", where}, {"what", what}}); }
};

// Decodes one encoded layer and checks its planes against its shape; the
// shape is kept for the boundary check.
void CheckLayer(const std::string& where, const EncodedLayer& layer, std::vector<LayerShape>* shapes,
                Findings* f) {
  auto shape = CheckDecodes(layer);
  if (!shape.ok()) return f->Add(where, shape.status().message());
  shapes->push_back(*shape);
}

// The layers together: their lengths against the boundary's tokens and,
// when the model is known, their shapes against its plan.
void CheckBoundaryOf(const std::string& where, const std::vector<std::uint32_t>& tokens,
                     const std::optional<ModelFingerprint>& model, const std::vector<LayerShape>& shapes,
                     std::size_t layers, Findings* f) {
  if (shapes.size() != layers) return;  // a layer failed already; its problem is reported
  BoundaryHeader b;
  b.tokens = tokens;
  b.boundary_len = tokens.size();
  Status s = CheckBoundary(b, shapes);
  if (!s.ok()) f->Add(where, s.message());
  if (model.has_value()) {
    s = CheckPlan(*model, shapes);
    if (!s.ok()) f->Add(where, s.message());
  }
}

// The model a descriptor names; none when there is no descriptor, and a
// finding when there is one that does not decode.
std::optional<ModelFingerprint> ModelOf(const std::string& where, const std::string& descriptor, Findings* f) {
  if (descriptor.empty()) return std::nullopt;
  auto fp = DecodeFingerprint(descriptor);
  if (!fp.ok()) {
    f->Add(where, "model descriptor: " + fp.status().message());
    return std::nullopt;
  }
  return *fp;
}

// Fetches, decodes and validates one entry. Returns an error only when the
// entry could not be examined (gone, or the store unreachable); damage is a
// finding.
Status VerifyEntry(Target& access, std::uint64_t id, Findings* f) {
  const std::string where = "entry " + std::to_string(id);
  PC_ASSIGN_OR_RETURN(EntryDetail detail, access.store->Describe(id));
  const EntryInfo& e = detail.info;
  ++f->entries;
  if (e.quarantined()) {
    f->Add(where, "quarantined: " + e.reason);
    return Status::Ok();
  }
  std::vector<LayerShape> shapes;
  std::optional<EncodedLayer> current;
  std::uint32_t current_index = 0, layers_seen = 0;
  auto finish = [&] {
    if (current.has_value()) CheckLayer(where + ", layer " + std::to_string(current_index), *current, &shapes, f);
    current.reset();
  };
  FetchHandlers h;
  h.on_layer = [&](std::uint32_t layer, std::string_view header, std::uint32_t chunks) -> Status {
    finish();
    ++layers_seen;
    ++f->layers;
    current_index = layer;
    auto parsed = ParseLayerHeader(AsBytes(header));
    if (!parsed.ok()) {
      f->Add(where + ", layer " + std::to_string(layer), "header: " + parsed.status().message());
      return Status::Ok();  // its chunks are still read (and their addresses checked)
    }
    current = EncodedLayer{std::move(parsed).value(), {}};
    current->chunks.reserve(chunks);
    return Status::Ok();
  };
  h.on_chunk = [&](std::uint32_t, std::uint32_t, std::span<const std::byte> bytes) -> Status {
    ++f->chunks;
    f->bytes += bytes.size();
    if (current.has_value()) current->chunks.emplace_back(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return Status::Ok();
  };
  Status s = FetchWith(*access.store, id, h);
  if (s.IsCorruption()) {
    f->Add(where, s.message() + (access.writable() ? "" : " (read-only: not quarantined)"));
    return Status::Ok();
  }
  PC_RETURN_IF_ERROR(s);
  finish();
  if (layers_seen != e.layers) {
    f->Add(where, std::to_string(layers_seen) + " layers fetched; the entry records " + std::to_string(e.layers));
  }
  if (e.tokens.size() != e.length) {
    f->Add(where, std::to_string(e.tokens.size()) + " tokens stored; the entry records length " +
                      std::to_string(e.length));
  }
  CheckBoundaryOf(where, e.tokens, ModelOf(where, e.model_descriptor, f), shapes, layers_seen, f);
  return Status::Ok();
}

void VerifyFile(const std::string& file, Findings* f) {
  const std::string where = "file " + file;
  auto snap = ReadPcsnap(Env::Default(), file);
  if (!snap.ok()) {
    // Its message names the file, as `where` does already.
    std::string_view what = snap.status().message();
    if (what.starts_with(file + ": ")) what.remove_prefix(file.size() + 2);
    return f->Add(where, std::string(what));
  }
  ++f->entries;
  std::vector<LayerShape> shapes;
  for (std::size_t i = 0; i < snap->layers.size(); ++i) {
    ++f->layers;
    for (const auto& c : snap->layers[i].chunks) {
      ++f->chunks;
      f->bytes += c.size();
    }
    CheckLayer(where + ", layer " + std::to_string(i), snap->layers[i], &shapes, f);
  }
  CheckBoundaryOf(where, snap->header.tokens, snap->header.fingerprint, shapes, snap->layers.size(), f);
}

// The findings as the result of `verify`: a JSON document or lines; exit 0
// when there are none, 1 (damage) otherwise.
int Report(const Findings& f, const std::string& target, const Output& out) {
  const bool ok = f.problems.empty();
  out.Json({{"ok", ok},
            {"target", target},
            {"checked", {{"entries", f.entries}, {"layers", f.layers}, {"chunks", f.chunks}, {"bytes", f.bytes}}},
            {"problems", f.problems}});
  const std::string counts = std::to_string(f.entries) + " entries, " + std::to_string(f.layers) + " layers, " +
                             std::to_string(f.chunks) + " chunks, " + HumanBytes(f.bytes) + " read";
  if (ok) {
    out.Line("ok: " + target + ": " + counts + "; every checksum, layer and reference agrees");
    return kExitOk;
  }
  out.Line("DAMAGE: " + target + ": " + std::to_string(f.problems.size()) + " problems (" + counts + ")");
  for (const auto& p : f.problems) out.Line("  " + p["where"].get<std::string>() + ": " + p["what"].get<std::string>());
  return kExitDamage;
}

}  // namespace

int Verify(Target* access, const VerifyOptions& o, const Output& out) {
  Findings f;
  std::string target;
  if (!o.file.empty()) {
    target = "file " + o.file;
    if (!Env::Default()->FileExists(o.file)) return out.Error(Status::NotFound("no file " + o.file));
    VerifyFile(o.file, &f);
  } else if (o.entry.has_value()) {
    target = "entry " + std::to_string(*o.entry);
    Status s = VerifyEntry(*access, *o.entry, &f);
    if (!s.ok()) return out.Error(s);
  } else {
    target = "store " + access->where;
    // Known damage first, so that what this run quarantines is not counted twice.
    auto quarantined = ListAll(*access->store, EntryState::kQuarantined);
    if (!quarantined.ok()) return out.Error(quarantined.status());
    for (const auto& e : *quarantined) f.Add("entry " + std::to_string(e.id), "quarantined: " + e.reason);
    out.Progress("checking records and chunk references", 0, 1);
    auto check = access->store->CheckStore({.read_chunks = true});
    if (!check.ok()) return out.Error(check.status());
    for (const auto& p : check->problems) f.Add("store", p);
    if (check->problem_count > check->problems.size()) {
      f.Add("store", std::to_string(check->problem_count - check->problems.size()) + " more problems not shown");
    }
    auto live = ListAll(*access->store, EntryState::kLive);
    if (!live.ok()) return out.Error(live.status());
    for (std::size_t i = 0; i < live->size(); ++i) {
      out.Progress("verifying entries", i, live->size());
      Status s = VerifyEntry(*access, (*live)[i].id, &f);
      if (s.IsNotFound()) continue;  // removed meanwhile
      if (!s.ok()) return out.Error(s);
    }
    f.entries += quarantined->size();
    out.EndProgress();
  }
  return Report(f, target, out);
}

// ---- verify --remote --------------------------------------------------------------------

namespace {

// Checks one chunk value against the manifest's reference; keeps the bytes
// of a good one in `layer` (reset once the layer has a bad chunk).
// `key` is the chunk's key in the cluster.
void CheckRemoteChunk(const std::string& where, const std::string& key, const ChunkRef& ref,
                      std::optional<std::string> value, std::optional<EncodedLayer>* layer, Findings* f) {
  ++f->chunks;
  const remote::ChunkCheck check = remote::CheckChunk(ref, value);
  if (check != remote::ChunkCheck::kOk) {
    f->Add(where + " (" + key + ")", remote::ChunkCheckText(check, ref, value));
    layer->reset();
    return;
  }
  f->bytes += value->size();
  if (layer->has_value()) (*layer)->chunks.push_back(std::move(*value));
}

// One layer of a remote entry: its header parsed, every chunk checked, and,
// when all are good, decoded and validated (its shape kept in *shapes).
// `ns`: the entry's namespace, whose key prefix its chunks are under.
void CheckRemoteLayer(const std::string& where, std::string_view ns, const ManifestLayer& ml,
                      std::vector<std::optional<std::string>>& values, std::size_t* next,
                      std::vector<LayerShape>* shapes, Findings* f) {
  ++f->layers;
  std::optional<EncodedLayer> layer;
  auto header = ParseLayerHeader(AsBytes(ml.header));
  if (header.ok()) {
    layer = EncodedLayer{std::move(header).value(), {}};
  } else {
    f->Add(where, "header: " + header.status().message());
  }
  for (std::size_t c = 0; c < ml.chunks.size(); ++c) {
    CheckRemoteChunk(where + ", chunk " + std::to_string(c), remote::ChunkKey(ns, ml.chunks[c].address),
                     ml.chunks[c], std::move(values[(*next)++]), &layer, f);
  }
  if (layer.has_value()) CheckLayer(where, *layer, shapes, f);
}

// The remote entry behind `key`: whether lookups reach it, every chunk
// checked, every layer decoded and validated, the boundary checked. Returns
// an error only when the entry could not be examined; damage is a finding.
Status VerifyRemoteEntry(remote::RemoteTier& tier, const std::string& key, Findings* f) {
  const std::string where = "remote entry " + std::string(RemoteId(key));
  PC_ASSIGN_OR_RETURN(auto read, tier.ReadManifests(std::span<const std::string>(&key, 1)));
  if (!read.front().has_value()) return Status::NotFound("no remote entry " + key);
  ++f->entries;
  if (!read.front()->ok()) {
    f->Add(where, "manifest: " + read.front()->status().message());
    return Status::Ok();
  }
  const remote::RemoteManifest& m = **read.front();
  const auto& tokens = m.entry.tokens;
  if (remote::ManifestKey(m.entry.model, m.entry.ns, tokens) != key) {
    f->Add(where, "the manifest is another entry's (its model, namespace and tokens do not give this key)");
  }
  PC_ASSIGN_OR_RETURN(auto hit, tier.Lookup(m.entry.model, m.entry.ns, tokens));
  if (!hit || hit->length != tokens.size()) f->Add(where, "no index member leads to it: lookups never find it");
  PC_ASSIGN_OR_RETURN(auto values, tier.ReadChunks(m));
  std::vector<LayerShape> shapes;
  std::size_t next = 0;
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    CheckRemoteLayer(where + ", layer " + std::to_string(l), m.entry.ns, m.layers[l], values, &next, &shapes,
                     f);
  }
  CheckBoundaryOf(where, tokens, ModelOf(where, m.entry.model_descriptor, f), shapes, m.layers.size(), f);
  return Status::Ok();
}

}  // namespace

int VerifyRemote(const RemoteOptions& options, const std::string& entry, const Output& out) {
  auto tier = OpenRemote(options);
  if (!tier.ok()) return RemoteError(out, tier.status());
  auto key = ResolveRemoteEntry(**tier, entry);
  if (!key.ok()) return RemoteError(out, key.status());
  Findings f;
  Status s = VerifyRemoteEntry(**tier, *key, &f);
  if (!s.ok()) return RemoteError(out, s);
  return Report(f, "remote entry " + *key + " on " + options.url, out);
}

}  // namespace primecache::ctl
