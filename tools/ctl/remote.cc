// ls --remote and show --remote: the remote tier's manifests, read from the
// cluster (tools/ctl/remote.h). verify --remote is in verify.cc.
#include "tools/ctl/remote.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "remote/cluster_client.h"
#include "remote/manifest.h"
#include "tools/ctl/entry_view.h"

namespace primecache::ctl {

namespace {

constexpr std::size_t kIdDigits = 32;
// Manifests read in one GetMany: a manifest holds its tokens (up to 16 MiB),
// so a batch is kept small; ls keeps no tokens past its batch.
constexpr std::size_t kReadBatch = 64;

// One manifest found in the cluster, described as ls and show describe a
// local entry (EntryInfo's id is its place in the listing).
struct RemoteRow {
  std::string key;
  EntryInfo info;
  std::uint64_t chunks = 0;
};

// The manifest as an entry; its tokens only when asked for.
EntryInfo InfoOf(const remote::RemoteManifest& m, bool with_tokens, std::uint64_t* chunks) {
  EntryInfo e;
  e.model = m.entry.model;
  e.model_name = m.entry.model_name;
  e.model_descriptor = m.entry.model_descriptor;
  e.ns = m.entry.ns;
  if (with_tokens) e.tokens = m.entry.tokens;
  e.length = m.entry.tokens.size();
  e.layers = static_cast<std::uint32_t>(m.layers.size());
  e.ranks = m.entry.EntryRanks();
  *chunks = 0;
  for (const ManifestLayer& l : m.layers) {
    *chunks += l.chunks.size();
    for (const ChunkRef& c : l.chunks) e.chunk_bytes += c.size;
  }
  return e;
}

// Every manifest in the cluster, in key order, without tokens; those that do
// not decode go to *unreadable (those gone since the listing are left out).
Result<std::vector<RemoteRow>> ReadAll(remote::RemoteTier& tier, bool* truncated,
                                       std::vector<std::pair<std::string, std::string>>* unreadable) {
  PC_ASSIGN_OR_RETURN(std::vector<std::string> keys, tier.ManifestKeys(kMaxRemoteEntries));
  *truncated = keys.size() >= kMaxRemoteEntries;
  std::sort(keys.begin(), keys.end());
  std::vector<RemoteRow> rows;
  for (std::size_t at = 0; at < keys.size(); at += kReadBatch) {
    const auto batch = std::span<const std::string>(keys).subspan(at, std::min(kReadBatch, keys.size() - at));
    PC_ASSIGN_OR_RETURN(auto manifests, tier.ReadManifests(batch));
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (!manifests[i].has_value()) continue;  // removed meanwhile
      if (!manifests[i]->ok()) {
        unreadable->emplace_back(batch[i], manifests[i]->status().message());
        continue;
      }
      RemoteRow& row = rows.emplace_back();
      row.key = batch[i];
      row.info = InfoOf(**manifests[i], /*with_tokens=*/false, &row.chunks);
      row.info.id = rows.size() - 1;
    }
  }
  return rows;
}

// One remote entry as ls --json and show --json give it.
nlohmann::json EntryJson(const std::string& key, const EntryInfo& e, std::uint64_t chunks) {
  return {{"id", std::string(RemoteId(key))},
          {"key", key},
          {"model", {{"name", e.model_name}, {"digest", HexDigits(e.model)}}},
          {"namespace", e.ns},
          {"length", e.length},
          {"layers", e.layers},
          {"ranks", e.ranks},
          {"chunks", chunks},
          {"bytes", e.chunk_bytes}};
}

bool IsHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isxdigit(c) != 0; });
}

}  // namespace

Result<std::unique_ptr<remote::RemoteTier>> OpenRemote(const RemoteOptions& options) {
  remote::ClusterOptions co;
  PC_ASSIGN_OR_RETURN(co.seeds, remote::ParseRedisUrl(options.url));
  PC_ASSIGN_OR_RETURN(co.auth, remote::LoadRedisAuth(options.auth));
  co.io_timeout = options.timeout;
  co.connect_timeout = std::min(options.timeout, std::chrono::milliseconds(1000));
  auto client = remote::ClusterClient::Connect(co);
  if (client.status().code() == StatusCode::kFailedPrecondition) return client.status();  // refused: says why
  if (!client.ok()) {
    return Status::Unavailable("no node of the cluster " + options.url + " answers: " + client.status().message());
  }
  return std::make_unique<remote::RemoteTier>(std::shared_ptr<remote::ClusterClient>(std::move(client).value()));
}

std::string_view RemoteId(std::string_view manifest_key) {
  return manifest_key.size() < kIdDigits ? manifest_key : manifest_key.substr(manifest_key.size() - kIdDigits);
}

Result<std::string> ResolveRemoteEntry(remote::RemoteTier& tier, std::string_view name) {
  if (name.starts_with("pc:t:")) return std::string(name);
  if (name.size() < 4 || name.size() > kIdDigits || !IsHex(name)) {
    return Status::InvalidArgument(
        "a remote entry is its manifest key (pc:t:...) or 4 to 32 hex digits of its id, not '" +
        std::string(name) + "'");
  }
  std::string prefix(name);
  std::transform(prefix.begin(), prefix.end(), prefix.begin(), [](unsigned char c) { return std::tolower(c); });
  PC_ASSIGN_OR_RETURN(std::vector<std::string> keys, tier.ManifestKeys(kMaxRemoteEntries));
  std::vector<std::string> found;
  for (std::string& k : keys) {
    if (RemoteId(k).starts_with(prefix)) found.push_back(std::move(k));
  }
  if (found.empty()) return Status::NotFound("no remote entry's id starts with " + prefix);
  if (found.size() > 1) {
    return Status::InvalidArgument(prefix + " begins the ids of " + std::to_string(found.size()) +
                                   " remote entries; give more digits or the manifest key");
  }
  return std::move(found.front());
}

int RemoteAcl(const std::vector<std::string>& namespaces, const Output& out) {
  const std::string rules = remote::NamespaceAclRules(namespaces);
  if (out.json()) {
    nlohmann::json prefixes = nlohmann::json::array();
    for (const std::string& ns : namespaces)
      prefixes.push_back({{"namespace", ns}, {"prefix", remote::NamespaceKeyPrefix(ns)}});
    out.Json({{"rules", rules}, {"prefixes", prefixes}});
    return 0;
  }
  out.Line(rules);
  return 0;
}

int RemoteError(const Output& out, const Status& s) {
  if (s.code() != StatusCode::kInvalidArgument) return out.Error(s);
  std::fprintf(stderr, "primecachectl: %s\n", s.message().c_str());  // as CLI11's usage errors: no JSON
  return kExitUsage;
}

// ---- ls --remote ------------------------------------------------------------------------

int LsRemote(const RemoteOptions& options, const LsOptions& o, const Output& out) {
  auto tier = OpenRemote(options);
  if (!tier.ok()) return RemoteError(out, tier.status());
  bool truncated = false;
  std::vector<std::pair<std::string, std::string>> unreadable;
  auto all = ReadAll(**tier, &truncated, &unreadable);
  if (!all.ok()) return RemoteError(out, all.status());
  std::vector<EntryInfo> shown;
  for (const RemoteRow& r : *all) {
    if (Matches(r.info, o)) shown.push_back(r.info);
  }
  SortEntries(shown, o.sort, o.reverse);  // "id" is key order
  if (o.limit > 0 && shown.size() > o.limit) shown.resize(o.limit);
  nlohmann::json list = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  std::uint64_t bytes = 0;
  for (const EntryInfo& e : shown) {
    const RemoteRow& r = (*all)[e.id];
    list.push_back(EntryJson(r.key, r.info, r.chunks));
    rows.push_back({std::string(RemoteId(r.key)).substr(0, 12), e.model_name, HexDigits(e.model).substr(0, 12),
                    NamespaceLabel(e.ns), std::to_string(e.length), std::to_string(e.layers),
                    std::to_string(r.chunks), HumanBytes(e.chunk_bytes)});
    bytes += e.chunk_bytes;
  }
  nlohmann::json bad = nlohmann::json::array();
  for (const auto& [key, why] : unreadable) bad.push_back({{"key", key}, {"error", why}});
  out.Json({{"source", options.url}, {"entries", list}, {"unreadable", bad}, {"truncated", truncated}});
  if (!out.json()) {
    out.Line(RenderTable({"ID", "MODEL", "FINGERPRINT", "NAMESPACE", ">LENGTH", ">LAYERS", ">CHUNKS", ">BYTES"}, rows));
    out.Line(std::to_string(shown.size()) + " remote entries, " + HumanBytes(bytes) +
             " of chunks (shared chunks counted in each); " + options.url);
  }
  for (const auto& [key, why] : unreadable) out.Note(key + ": unreadable manifest: " + why);
  if (truncated) out.Note("the listing stops at " + std::to_string(kMaxRemoteEntries) + " manifests");
  return kExitOk;
}

// ---- show --remote ----------------------------------------------------------------------

namespace {

// The manifest behind `name`, with its key; kNotFound when there is none,
// kCorruption when it does not decode.
Result<std::pair<std::string, remote::RemoteManifest>> ReadOne(remote::RemoteTier& tier, std::string_view name) {
  PC_ASSIGN_OR_RETURN(std::string key, ResolveRemoteEntry(tier, name));
  PC_ASSIGN_OR_RETURN(auto read, tier.ReadManifests(std::span<const std::string>(&key, 1)));
  if (!read.front().has_value()) return Status::NotFound("no remote entry " + key);
  if (!read.front()->ok()) return read.front()->status().WithContext(key);
  return std::pair{std::move(key), std::move(*read.front()).value()};
}

nlohmann::json ChunkRefsJson(std::string_view ns, const ManifestLayer& l) {
  nlohmann::json refs = nlohmann::json::array();
  for (const ChunkRef& c : l.chunks)
    refs.push_back({{"key", remote::ChunkKey(ns, c.address)}, {"size", c.size}});
  return refs;
}

void ShowRemoteText(const std::string& key, const EntryInfo& e, std::uint64_t chunks, const nlohmann::json& fp,
                    const std::string& text, const std::vector<std::vector<std::string>>& rows, const Output& out) {
  out.Line("remote entry " + std::string(RemoteId(key)));
  out.Line("  key        " + key);
  out.Line("  model      " + e.model_name + "  " + HexDigits(e.model));
  if (!fp.is_null()) {
    out.Line("  plan       " + fp["plan_digest"].get<std::string>());
    out.Line("  weights    " + fp["weights_digest"].get<std::string>());
  }
  out.Line("  namespace  " + NamespaceLabel(e.ns));
  out.Line("  boundary   " + std::to_string(e.length) + " tokens, " + std::to_string(e.layers) + " layers");
  if (e.ranks > 1) out.Line("  ranks      " + std::to_string(e.ranks) + " (tensor-parallel; its parts in the layer order)");
  out.Line("  chunks     " + std::to_string(chunks) + ", " + HumanBytes(e.chunk_bytes));
  out.Line("  text       " + text);
  out.Line("");
  out.Line(RenderTable(ShownLayerColumns(), rows));
}

}  // namespace

int ShowRemote(const RemoteOptions& options, const std::string& entry, std::size_t text_chars, const Output& out) {
  auto tier = OpenRemote(options);
  if (!tier.ok()) return RemoteError(out, tier.status());
  auto found = ReadOne(**tier, entry);
  if (!found.ok()) return RemoteError(out, found.status());
  const auto& [key, m] = *found;
  std::uint64_t chunks = 0;
  const EntryInfo e = InfoOf(m, /*with_tokens=*/true, &chunks);
  bool shortened = false;
  const std::string text = TokensAsText(e.tokens, text_chars, &shortened);
  std::string fp_problem;
  const nlohmann::json fp = FingerprintJson(e, &fp_problem);
  nlohmann::json layers = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> problems;
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    ShownLayer layer = ShowLayer(i, m.layers[i].header);
    layer.json["chunk_refs"] = ChunkRefsJson(m.entry.ns, m.layers[i]);
    layers.push_back(std::move(layer.json));
    rows.push_back(std::move(layer.row));
    if (!layer.problem.empty()) problems.push_back(std::move(layer.problem));
  }
  nlohmann::json doc = {{"source", options.url},
                        {"entry", EntryJson(key, e, chunks)},
                        {"tokens", {{"count", e.tokens.size()}, {"text", text}, {"shortened", shortened}}},
                        {"fingerprint", fp},
                        {"layers", layers}};
  if (!fp_problem.empty()) doc["fingerprint_error"] = fp_problem;
  out.Json(doc);
  if (!out.json()) ShowRemoteText(key, e, chunks, fp, text, rows, out);
  for (const auto& p : problems) out.Note(p);
  return problems.empty() ? kExitOk : kExitDamage;
}

}  // namespace primecache::ctl
