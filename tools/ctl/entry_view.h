// Pieces of `ls` and `show` that the local store's entries and the remote
// tier's (tools/ctl/remote.cc) share: filters, labels, and one layer's and
// one fingerprint's description. Plain functions.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "primecache/entry.h"
#include "primecache/internal/shard.h"
#include "tools/ctl/commands.h"

namespace primecache::ctl {

// "(default)" for the empty namespace.
std::string NamespaceLabel(const std::string& ns);
// Whether `e` passes ls's --model, --namespace and --min-length.
bool Matches(const EntryInfo& e, const LsOptions& o);
// Orders by ls's --sort key (id, age, size, raw, length, layers, hits,
// recent), then by id, so every order is total.
void SortEntries(std::vector<EntryInfo>& v, const std::string& key, bool reverse);
// The entry's fingerprint, from its descriptor; null when there is none (or
// it does not decode: *problem says why).
nlohmann::json FingerprintJson(const EntryInfo& e, std::string* problem);

// One layer of `show`, from its serialized header: the JSON, the table row
// (under ShownLayerColumns), and what is wrong with the header (empty when
// it parses).
struct ShownLayer {
  nlohmann::json json;
  std::vector<std::string> row;
  std::string problem;
};
ShownLayer ShowLayer(std::size_t i, const std::string& header);
std::vector<std::string> ShownLayerColumns();

// A tensor-parallel entry's layers' parts (EntryLayerParts in
// primecache/internal/shard.h), all unset for an entry of one publisher; a
// header that does not parse, or layers that are not a TP entry's, are
// noted in *problems and leave every part unset.
std::vector<std::optional<EntryLayerPart>> LayerParts(const EntryInfo& e, const std::vector<std::string>& headers,
                                                      std::vector<std::string>* problems);

}  // namespace primecache::ctl
