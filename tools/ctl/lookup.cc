// lookup: what a request with these tokens would restore (the longest
// stored boundary that prefixes them) and its branch point (how far a stored
// entry of the model shares its tokens, boundary there or not), as the
// serving path asks the daemon.
#include <set>

#include "primecache/internal/model.h"
#include "tools/ctl/commands.h"
#include "tools/ctl/entry_view.h"

namespace primecache::ctl {

namespace {

// The one stored model that `name_or_digest` names.
Result<std::pair<Hash128, std::string>> ResolveModel(Target& access, const std::string& name_or_digest) {
  PC_ASSIGN_OR_RETURN(std::vector<EntryInfo> entries, ListAll(*access.store, EntryState::kLive));
  std::set<std::pair<std::pair<std::uint64_t, std::uint64_t>, std::string>> models;
  for (const EntryInfo& e : entries) {
    if (e.model_name == name_or_digest || HexPrefixMatches(e.model, name_or_digest)) {
      models.insert({{e.model.hi, e.model.lo}, e.model_name});
    }
  }
  if (models.empty()) return Status::NotFound("no stored entry is of a model named " + name_or_digest);
  if (models.size() > 1) {
    return Status::InvalidArgument(std::to_string(models.size()) + " stored models match " + name_or_digest +
                                   "; give more of a fingerprint (ls shows them)");
  }
  const auto& [digest, name] = *models.begin();
  return std::make_pair(Hash128{digest.second, digest.first}, name);
}

// The byte tokenizer's tokens of a text: <bos>, then its bytes.
std::vector<std::uint32_t> TextTokens(const std::string& text) {
  std::vector<std::uint32_t> t = {model::kBosToken};
  for (unsigned char c : text) t.push_back(c);
  return t;
}

}  // namespace

int Lookup(Target& access, const LookupCommand& command, const Output& out) {
  const std::vector<std::uint32_t> tokens = command.text.empty() ? command.tokens : TextTokens(command.text);
  auto model = ResolveModel(access, command.model);
  if (!model.ok()) {
    const int code = out.Error(model.status());
    return model.status().IsInvalidArgument() ? kExitUsage : code;  // an ambiguous name: say more of it
  }
  std::uint64_t shared = 0;
  // Read-only, nothing is recorded; the daemon counts every lookup (a hit,
  // a miss, recency), as its own.
  LookupOptions lo;
  lo.record = false;
  lo.shared_tokens = &shared;
  auto hit = access.store->Lookup(model->first, command.ns, tokens, lo);
  if (!hit.ok()) return out.Error(hit.status());
  nlohmann::json hit_json = nullptr;
  if (*hit) hit_json = {{"id", (*hit)->id}, {"length", (*hit)->length}, {"layers", (*hit)->layers}};
  out.Json({{"source", access.where},
            {"model", {{"name", model->second}, {"digest", HexDigits(model->first)}}},
            {"namespace", command.ns},
            {"query_tokens", tokens.size()},
            {"hit", hit_json},
            {"shared_tokens", shared}});
  out.Line("lookup  model " + model->second + " (" + HexDigits(model->first).substr(0, 12) + "), namespace " +
           NamespaceLabel(command.ns) + ", " + std::to_string(tokens.size()) + " query tokens");
  if (*hit) {
    out.Line("hit     entry " + std::to_string((*hit)->id) + ": its " + std::to_string((*hit)->length) +
             " tokens restore; " + std::to_string(tokens.size() - (*hit)->length) + " are prefilled");
  } else {
    out.Line("hit     none: all " + std::to_string(tokens.size()) + " tokens are prefilled");
  }
  out.Line("shared  " + std::to_string(shared) + " tokens: the longest prefix a stored entry shares (branch point)" +
           (shared > ((*hit) ? (*hit)->length : 0) ? "; a capture there would make it a boundary" : ""));
  return kExitOk;
}

}  // namespace primecache::ctl
