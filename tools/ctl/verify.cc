// verify: decodes and validates entries (every chunk against its content
// address and its encoded and raw checksums, every layer's shape against its
// planes and the boundary), cross-checks the store's records and reference
// counts (--all), or checks a .pcsnap file through and through (--file).
#include <optional>

#include "primecache/codec.h"
#include "primecache/env.h"
#include "primecache/snapshot.h"
#include "tools/ctl/commands.h"

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
  auto snap = DecodeLayer(layer);
  if (!snap.ok()) return f->Add(where, snap.status().message());
  Status s = CheckSnapshot(*snap);
  if (!s.ok()) return f->Add(where, s.message());
  shapes->push_back(ShapeOf(*snap));
}

void CheckBoundaryOf(const std::string& where, const std::vector<std::uint32_t>& tokens,
                     const std::vector<LayerShape>& shapes, std::size_t layers, Findings* f) {
  if (shapes.size() != layers) return;  // a layer failed already; its problem is reported
  BoundaryHeader b;
  b.tokens = tokens;
  b.boundary_len = tokens.size();
  Status s = CheckBoundary(b, shapes);
  if (!s.ok()) f->Add(where, s.message());
}

// Fetches, decodes and validates one entry. Returns an error only when the
// entry could not be examined (gone, or the store unreachable); damage is a
// finding.
Status VerifyEntry(StoreAccess& access, std::uint64_t id, Findings* f) {
  const std::string where = "entry " + std::to_string(id);
  PC_ASSIGN_OR_RETURN(EntryInfo e, access.Describe(id, nullptr));
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
  Status s = access.Fetch(id, h);
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
  CheckBoundaryOf(where, e.tokens, shapes, layers_seen, f);
  return Status::Ok();
}

void VerifyFile(const std::string& file, Findings* f) {
  const std::string where = "file " + file;
  auto snap = ReadPcsnap(Env::Default(), file);
  if (!snap.ok()) return f->Add(where, snap.status().message());
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
  CheckBoundaryOf(where, snap->header.tokens, shapes, snap->layers.size(), f);
}

}  // namespace

int Verify(StoreAccess* access, const VerifyOptions& o, const Output& out) {
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
    target = "store " + access->where();
    // Known damage first, so that what this run quarantines is not counted twice.
    auto quarantined = access->List(true);
    if (!quarantined.ok()) return out.Error(quarantined.status());
    for (const auto& e : *quarantined) f.Add("entry " + std::to_string(e.id), "quarantined: " + e.reason);
    out.Progress("checking records and chunk references", 0, 1);
    auto check = access->CheckStore(/*read_chunks=*/true);
    if (!check.ok()) return out.Error(check.status());
    for (const auto& p : check->problems) f.Add("store", p);
    if (check->problem_count > check->problems.size()) {
      f.Add("store", std::to_string(check->problem_count - check->problems.size()) + " more problems not shown");
    }
    auto live = access->List(false);
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

}  // namespace primecache::ctl
