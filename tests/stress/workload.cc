#include "tests/stress/workload.h"

#include <algorithm>

#include "primecache/internal/codec.h"
#include "primecache/internal/shard.h"
#include "primecache/internal/snapshot.h"

namespace primecache::stress {

const char* PathName(Path p) {
  switch (p) {
    case Path::kPlain:
      return "plain";
    case Path::kBranch:
      return "branch";
    case Path::kGroup:
      return "group";
    case Path::kGc:
      return "gc";
  }
  return "?";
}

std::optional<Path> ParsePath(const std::string& name) {
  for (Path p : {Path::kPlain, Path::kBranch, Path::kGroup, Path::kGc}) {
    if (name == PathName(p)) return p;
  }
  return std::nullopt;
}

// ---- targets ---------------------------------------------------------------------------------

namespace {

class OnClient final : public Target {
 public:
  explicit OnClient(std::unique_ptr<client::Client> c) : c_(std::move(c)) {}
  Result<PublishResult> Publish(const std::vector<std::uint32_t>& tokens,
                                const std::vector<LayerData>& layers,
                                const std::optional<PublishGroup>& group, bool abandon) override {
    PC_ASSIGN_OR_RETURN(auto s, c_->BeginPublish(testing::TestModel(), tokens,
                                                 static_cast<std::uint32_t>(layers.size()), group));
    for (const LayerData& l : layers) {
      PC_RETURN_IF_ERROR(s->BeginLayer(l.header, static_cast<std::uint32_t>(l.chunks.size())));
      for (const auto& chunk : l.chunks) PC_RETURN_IF_ERROR(s->AddChunk(chunk));
    }
    if (abandon) {
      PC_RETURN_IF_ERROR(s->Abort());
      return Status::Aborted("abandoned");
    }
    return s->Commit();
  }
  Result<std::optional<LookupHit>> Lookup(const std::vector<std::uint32_t>& tokens,
                                          std::uint64_t* shared) override {
    return c_->Lookup(testing::TestModel(), tokens, shared);
  }
  Result<std::uint64_t> FetchDigest(std::uint64_t entry) override {
    PC_ASSIGN_OR_RETURN(auto layers, c_->FetchLayers(entry));
    return LayersDigest(layers);
  }
  Status Delete(std::uint64_t entry) override { return c_->Delete(entry); }
  Status Compact() override { return c_->Compact(); }
  Result<std::vector<Stored>> ListAll() override {
    PC_ASSIGN_OR_RETURN(auto all, stress::ListAll(*c_));
    std::vector<Stored> out;
    for (auto& e : all) out.push_back({e.id, std::move(e.tokens), e.ranks});
    return out;
  }
  Result<std::uint64_t> Evictions() override {
    PC_ASSIGN_OR_RETURN(auto st, c_->Stat());
    return st.store.evictions;
  }

 private:
  std::unique_ptr<client::Client> c_;
};

PublishRequest RequestFor(const std::vector<std::uint32_t>& tokens,
                          const std::optional<PublishGroup>& group) {
  PublishRequest r;
  r.model = testing::TestModel().digest;
  r.model_name = "stress-model";
  r.tokens = tokens;
  r.cost = {1000, 2, 64};
  r.group = group;
  return r;
}

class OnStore final : public Target {
 public:
  explicit OnStore(LocalStore& s) : s_(s) {}
  Result<PublishResult> Publish(const std::vector<std::uint32_t>& tokens,
                                const std::vector<LayerData>& layers,
                                const std::optional<PublishGroup>& group, bool abandon) override {
    const std::vector<LayerBytes> bytes = ToLayerBytes(layers);
    if (!abandon) return s_.Publish(RequestFor(tokens, group), bytes);
    PC_ASSIGN_OR_RETURN(PublishStart start, s_.BeginPublish(RequestFor(tokens, group)));
    if (start.publisher == nullptr) return Status::AlreadyExists("stored already");
    for (const auto& layer : bytes) PC_RETURN_IF_ERROR(start.publisher->AddLayer(layer));
    start.publisher->Abort();
    return Status::Aborted("abandoned");
  }
  Result<std::optional<LookupHit>> Lookup(const std::vector<std::uint32_t>& tokens,
                                          std::uint64_t* shared) override {
    LookupOptions o;
    o.shared_tokens = shared;
    return s_.Lookup(testing::TestModel().digest, "", tokens, o);
  }
  Result<std::uint64_t> FetchDigest(std::uint64_t entry) override {
    PC_ASSIGN_OR_RETURN(auto layers, s_.FetchAll(entry));
    return LayersDigest(layers);
  }
  Status Delete(std::uint64_t entry) override { return s_.Delete(entry); }
  Status Compact() override { return s_.Compact(); }
  Result<std::vector<Stored>> ListAll() override {
    std::vector<Stored> out;
    ListOptions lo;
    lo.limit = 1000;
    for (;;) {
      PC_ASSIGN_OR_RETURN(auto page, s_.List(lo));
      for (auto& e : page.entries) {
        if (e.tokens.empty()) {
          PC_ASSIGN_OR_RETURN(auto d, s_.Describe(e.id));
          e.tokens = d.info.tokens;
        }
        out.push_back({e.id, std::move(e.tokens), e.ranks});
      }
      if (page.next_page_token.empty()) return out;
      lo.page_token = page.next_page_token;
    }
  }
  Result<std::uint64_t> Evictions() override {
    PC_ASSIGN_OR_RETURN(auto st, s_.Stat());
    return st.evictions;
  }

 private:
  LocalStore& s_;
};

}  // namespace

std::unique_ptr<Target> ClientTarget(std::unique_ptr<client::Client> c) {
  return std::make_unique<OnClient>(std::move(c));
}
std::unique_ptr<Target> StoreTarget(LocalStore& store) {
  return std::make_unique<OnStore>(store);
}

// ---- entries ---------------------------------------------------------------------------------

namespace {

LayerData Encode(const LayerSnapshot& snap, std::uint64_t target_chunk_bytes) {
  EncodeOptions eo;
  eo.all_planes = TransformSpec{std::string(kRawTransform), 0};
  eo.target_chunk_bytes = target_chunk_bytes;
  auto enc = EncodeLayer(snap, eo);
  if (!enc.ok()) std::abort();
  return testing::ToLayerData(*enc);
}

}  // namespace

std::vector<std::vector<LayerData>> GroupParts(const EntrySpec& spec, std::uint32_t ranks) {
  std::vector<std::vector<LayerData>> parts(ranks);
  std::mt19937 g(spec.seed);
  for (std::uint32_t l = 0; l < spec.layers; ++l) {
    const bool latent = l % 2 == 0;
    const LayerShape shape = latent ? LayerShape{LatentShape{spec.length, spec.width, 0, 0, 0, false, 0}}
                                    : LayerShape{RecurrentShape{kGroupHeads, 8, 4}};
    auto snap = MakeSnapshot(shape);
    if (!snap.ok()) std::abort();
    for (auto plane : CodecRegistry::Default().KindFor(shape).value()->MutablePlaneData(*snap)) {
      for (float& x : plane) x = static_cast<float>(g() % 100000) * 1e-3f;
    }
    if (latent) {
      parts[0].push_back(Encode(*snap, std::uint64_t{spec.rows_per_chunk} * spec.width * sizeof(float)));
      continue;
    }
    for (std::uint32_t r = 0; r < ranks; ++r) {
      auto shard = SliceRecurrent(std::get<RecurrentSnapshot>(*snap), ranks, r);
      if (!shard.ok()) std::abort();
      parts[r].push_back(Encode(LayerSnapshot{*shard}, 1u << 20));
    }
  }
  return parts;
}

std::vector<LayerData> Concat(const std::vector<std::vector<LayerData>>& parts) {
  std::vector<LayerData> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

void Queries::Add(std::vector<std::uint32_t> q) {
  std::lock_guard lock(mu_);
  queries_.push_back(std::move(q));
}

std::vector<std::vector<std::uint32_t>> Queries::Snapshot() const {
  std::lock_guard lock(mu_);
  return queries_;
}

void Queries::Clear() {
  std::lock_guard lock(mu_);
  queries_.clear();
}

void RecordAck(AckLog& log, int it, const std::string& what, std::uint64_t entry, std::uint64_t digest) {
  log.Record("ack iteration=" + std::to_string(it) + " " + what + " entry=" + std::to_string(entry) +
             " digest=" + std::to_string(digest));
}

// ---- workers ---------------------------------------------------------------------------------

namespace {

// A worker's failure: an error unless the kill (or power loss) came first.
void Failed(const Work& w, const char* what, int worker, const Status& s) {
  if (w.stop->load()) return;
  ++w.tally->errors;
  Say("%s: iteration %d worker %d: %s failed before the %s: %s", w.who, w.iteration, worker, what,
      std::string(w.who) == "crash" ? "kill" : "power loss", s.ToString().c_str());
}

std::mt19937_64 WorkerRng(const Work& w, int worker) {
  return std::mt19937_64(w.seed * 7919 + static_cast<std::uint64_t>(w.iteration) * 8 +
                         static_cast<std::uint64_t>(worker));
}

// The gc path's 16 MiB budget can be held whole by the entries its fetchers
// are reading, which may not be evicted: then a publish is refused, as the
// store promises, and the worker goes on.
bool BudgetHeldByEntriesInUse(const Work& w, const Status& s) {
  return w.path == Path::kGc && s.code() == StatusCode::kResourceExhausted &&
         s.message().find("nothing left that may be evicted") != std::string::npos;
}

// Publishes one entry of `layers` under `tokens`; false when the worker ends.
bool PublishOne(const Work& w, Target& t, int worker, const std::vector<std::uint32_t>& tokens,
                const std::vector<LayerData>& layers, const std::string& what) {
  const std::uint64_t digest = LayersDigest(layers);
  w.reg->Attempted(tokens, digest);
  ++w.tally->attempted;
  auto r = t.Publish(tokens, layers, std::nullopt, false);
  if (!r.ok() && BudgetHeldByEntriesInUse(w, r.status())) {
    ++w.tally->budget_refusals;
    return true;
  }
  if (!r.ok()) {
    Failed(w, "a publish", worker, r.status());
    return false;
  }
  w.reg->Acked(tokens, r->id);
  ++w.tally->acked;
  RecordAck(*w.log, w.iteration, what + " length=" + std::to_string(tokens.size()), r->id, digest);
  return true;
}

void Publisher(const Work& w, int worker) {
  auto t = w.connect();
  if (t == nullptr) return Failed(w, "a connect", worker, Status::Unavailable("no connection"));
  std::mt19937_64 rng = WorkerRng(w, worker);
  while (!w.stop->load()) {
    const EntrySpec spec = RandomSpec(rng, (*w.next_seed)++);
    if (!PublishOne(w, *t, worker, SpecTokens(spec), SpecLayers(spec), "seed=" + std::to_string(spec.seed)))
      return;
  }
}

// A boundary's content is a function of its tokens alone, so that two
// requests publishing one branch point publish the same entry.
std::vector<LayerData> BoundaryLayers(const std::vector<std::uint32_t>& tokens) {
  const auto seed = static_cast<std::uint32_t>(Checksum64(TokensKey(tokens)));
  return testing::MakeLayers(tokens.size(), 2 + seed % 3, seed, 64, 1u << (4 + seed % 4));
}

// The stems of this epoch's prompts: 3 system prompts, each followed by one
// of 4 few-shot blocks; requests add a tail of their own.
std::vector<std::uint32_t> Stem(const Work& w, std::mt19937_64& rng) {
  const auto sys = static_cast<std::uint32_t>(rng() % 3), shot = static_cast<std::uint32_t>(rng() % 4);
  const std::uint64_t base = w.seed * 1000003 + static_cast<std::uint64_t>(w.epoch) * 101;
  auto piece = [&](std::uint64_t k, std::uint32_t lo, std::uint32_t span) {
    const auto s = static_cast<std::uint32_t>(Checksum64(std::to_string(base + k)));
    return testing::Tokens(lo + s % span, s);
  };
  std::vector<std::uint32_t> stem = piece(sys, 64, 400);
  const auto more = piece(10 + sys * 4 + shot, 16, 300);
  stem.insert(stem.end(), more.begin(), more.end());
  return stem;
}

// One request as PrefixCache publishes it: the lookup's branch point (when
// past the hit), checkpoints (every 256 tokens past the hit, on odd
// workers), the prompt's end, then the generation's end.
bool BranchRequest(const Work& w, Target& t, int worker, std::mt19937_64& rng) {
  std::vector<std::uint32_t> prompt = Stem(w, rng);
  const auto tail = testing::Tokens(16 + rng() % 300, (*w.next_seed)++);
  prompt.insert(prompt.end(), tail.begin(), tail.end());
  std::uint64_t shared = 0;
  auto hit = t.Lookup(prompt, &shared);
  if (!hit.ok()) {
    Failed(w, "a lookup", worker, hit.status());
    return false;
  }
  const std::uint64_t from = *hit ? (*hit)->length : 0;
  std::vector<std::uint64_t> cuts;
  if (shared > from && shared < prompt.size()) cuts.push_back(shared);
  if (worker % 2 == 1) {
    for (std::uint64_t at = (from / 256 + 1) * 256; at < prompt.size(); at += 256) cuts.push_back(at);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<std::uint32_t> generated = prompt;
  const auto gen = testing::Tokens(8 + rng() % 56, (*w.next_seed)++);
  generated.insert(generated.end(), gen.begin(), gen.end());
  w.queries->Add(prompt);
  w.queries->Add(generated);
  std::vector<std::vector<std::uint32_t>> boundaries;
  for (std::uint64_t c : cuts)
    boundaries.emplace_back(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(c));
  boundaries.push_back(prompt);
  boundaries.push_back(generated);
  for (std::size_t i = 0; i < boundaries.size(); ++i) {
    const char* kind = i + 2 < boundaries.size()   ? "cut"
                       : i + 1 < boundaries.size() ? "prompt_end"
                                                   : "generation_end";
    if (!PublishOne(w, t, worker, boundaries[i], BoundaryLayers(boundaries[i]), kind)) return false;
  }
  return true;
}

void BranchRequester(const Work& w, int worker) {
  auto t = w.connect();
  if (t == nullptr) return Failed(w, "a connect", worker, Status::Unavailable("no connection"));
  std::mt19937_64 rng = WorkerRng(w, worker);
  while (!w.stop->load() && BranchRequest(w, *t, worker, rng)) {
  }
}

// Reads acknowledged entries at random: each fetch byte-exact or not found
// (deleted or evicted), never other bytes.
void Fetcher(const Work& w, int worker) {
  auto t = w.connect();
  if (t == nullptr) return Failed(w, "a connect", worker, Status::Unavailable("no connection"));
  std::mt19937_64 rng = WorkerRng(w, worker);
  while (!w.stop->load()) {
    auto pick = w.reg->RandomAcked(rng);
    if (!pick || pick->second.deleted || pick->second.evicted) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    auto got = t->FetchDigest(pick->second.entry);
    if (got.ok()) {
      ++w.tally->fetches;
      if (*got != pick->second.digest) {
        ++w.tally->wrong_bytes;
        Say("%s: iteration %d: a fetch of entry %llu returned WRONG BYTES", w.who, w.iteration,
            U(pick->second.entry));
      }
    } else if (got.status().IsNotFound()) {
      ++w.tally->fetch_misses;
      w.reg->Evicted(pick->first);  // unless a delete in flight removed it
    } else {
      return Failed(w, "a fetch", worker, got.status());
    }
  }
}

// Deletes acknowledged entries at random, and compacts now and then (segment
// gc of everything dead), while the others publish and fetch.
void Deleter(const Work& w, int worker) {
  auto t = w.connect_admin();
  if (t == nullptr) return Failed(w, "a connect", worker, Status::Unavailable("no connection"));
  std::mt19937_64 rng = WorkerRng(w, worker);
  for (int n = 1; !w.stop->load(); ++n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2 + rng() % 10));
    if (n % 8 == 2) {
      ++w.tally->compactions;  // begun: a second or so, and the kill often comes during one
      if (Status s = t->Compact(); !s.ok()) return Failed(w, "a compaction", worker, s);
      continue;
    }
    auto pick = w.reg->RandomAcked(rng);
    if (!pick || pick->second.deleting) continue;
    w.reg->Deleting(pick->first);
    Status s = t->Delete(pick->second.entry);
    if (s.code() == StatusCode::kUnavailable && !w.stop->load()) {
      w.reg->DeleteRefused(pick->first);  // leased by a fetch: not deleted
      continue;
    }
    if (!s.ok() && !s.IsNotFound()) return Failed(w, "a delete", worker, s);
    w.reg->Deleted(pick->first);  // gone, by this delete or an eviction before it
    if (s.ok()) ++w.tally->deletes;
  }
}

// Group publishes in this process: each rank a thread publishing its part
// of the group (one in eight groups has a rank abandon its part); the rank
// whose commit writes the entry acknowledges it.
void GroupDriver(const Work& w, int worker) {
  std::mt19937_64 rng = WorkerRng(w, worker);
  while (!w.stop->load()) {
    EntrySpec spec;
    spec.seed = (*w.next_seed)++;
    spec.length = 16 + static_cast<std::uint32_t>(rng() % 900);
    spec.layers = 2 + static_cast<std::uint32_t>(rng() % 3);
    spec.rows_per_chunk = 1u << (4 + rng() % 4);
    const auto ranks = static_cast<std::uint32_t>(2 + rng() % 3);
    const auto parts = GroupParts(spec, ranks);
    const auto tokens = SpecTokens(spec);
    const std::uint64_t digest = LayersDigest(Concat(parts));
    const int abandon = rng() % 8 == 0 ? static_cast<int>(rng() % ranks) : -1;
    const PublishGroup g0{(w.seed << 24) + spec.seed, ranks, 0};
    // An abandoned group must leave no entry: it is not registered, so one
    // listed after the crash is torn.
    if (abandon < 0) w.reg->Attempted(tokens, digest);
    ++w.tally->attempted;
    std::vector<int> delay_us;
    for (std::uint32_t r = 0; r < ranks; ++r) delay_us.push_back(static_cast<int>(rng() % 2000));
    std::atomic<bool> failed{false};
    std::vector<std::thread> threads;
    for (std::uint32_t r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        auto t = w.connect();
        if (t == nullptr) {
          failed = true;
          return Failed(w, "a connect", worker, Status::Unavailable("no connection"));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us[r]));
        PublishGroup g = g0;
        g.rank = r;
        auto res = t->Publish(tokens, parts[r], g, static_cast<int>(r) == abandon);
        if (abandon >= 0) return;  // aborted parts and refused commits are the point
        if (!res.ok()) {
          failed = true;
          return Failed(w, "a group part", worker, res.status());
        }
        if (res->group_pending) return;
        w.reg->Acked(tokens, res->id);
        ++w.tally->acked;
        RecordAck(*w.log, w.iteration,
                  "group seed=" + std::to_string(spec.seed) + " ranks=" + std::to_string(ranks), res->id,
                  digest);
      });
    }
    for (auto& th : threads) th.join();
    if (abandon >= 0) ++w.tally->groups_abandoned;
    if (failed) return;
  }
}

}  // namespace

std::vector<std::thread> StartWorkers(const Work& w, int n) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    switch (w.path) {
      case Path::kPlain:
      case Path::kGc:
        threads.emplace_back([&w, i] { Publisher(w, i); });
        break;
      case Path::kBranch:
        threads.emplace_back([&w, i] { BranchRequester(w, i); });
        break;
      case Path::kGroup:
        threads.emplace_back([&w, i] { GroupDriver(w, i); });
        break;
    }
  }
  if (w.path == Path::kGc) {
    threads.emplace_back([&w, n] { Deleter(w, n); });
    threads.emplace_back([&w, n] { Fetcher(w, n + 1); });
    threads.emplace_back([&w, n] { Fetcher(w, n + 2); });
  }
  return threads;
}

// ---- the check -------------------------------------------------------------------------------

namespace {

// The longest acknowledged (and not deleted) boundary that prefixes `q`.
std::uint64_t LongestAcked(const std::map<std::string, Registry::Attempt>& all, const std::string& q) {
  std::uint64_t best = 0;
  for (const auto& [key, a] : all) {
    if (a.acked && !a.deleted && a.length > best && q.starts_with(key)) best = a.length;
  }
  return best;
}

// Every request's lookup after the crash: a hit at least as long as the
// longest acknowledged boundary of it, on a listed (and so checked) entry;
// a branch point no shorter.
void CheckLookups(Target& t, const std::map<std::string, Registry::Attempt>& all,
                  const std::map<std::string, std::uint64_t>& stored, const Queries& queries, const char* who,
                  int it, CheckTally* c) {
  for (const auto& q : queries.Snapshot()) {
    const std::uint64_t want = LongestAcked(all, TokensKey(q));
    std::uint64_t shared = 0;
    auto hit = t.Lookup(q, &shared);
    ++c->lookups_checked;
    if (!hit.ok()) {
      ++c->torn;
      Say("%s: iteration %d: a lookup failed: %s", who, it, hit.status().ToString().c_str());
      continue;
    }
    const std::uint64_t got = *hit ? (*hit)->length : 0;
    if (got < want || shared < want) {
      ++c->lost;
      Say("%s: iteration %d: LOST: a lookup of %zu tokens hit %llu (branch point %llu), acknowledged %llu",
          who, it, q.size(), U(got), U(shared), U(want));
    }
    if (*hit) {
      const std::vector<std::uint32_t> prefix(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(got));
      auto at = stored.find(TokensKey(prefix));
      if (at == stored.end() || at->second != (*hit)->id) {
        ++c->torn;
        Say("%s: iteration %d: TORN: a lookup hit entry %llu, which the listing does not hold", who, it,
            U((*hit)->id));
      }
    }
  }
}

}  // namespace

void CheckSurvivors(Target& t, Path path, const Registry& reg, const Queries& queries, const char* who,
                    int it, std::set<std::uint64_t>* unacked_seen, CheckTally* c) {
  auto listed = t.ListAll();
  if (!listed.ok()) {
    ++c->torn;
    Say("%s: iteration %d: cannot list the store: %s", who, it, listed.status().ToString().c_str());
    return;
  }
  std::map<std::string, std::uint64_t> stored;  // tokens -> entry
  for (const Stored& e : *listed) {
    const std::string key = TokensKey(e.tokens);
    stored[key] = e.id;
    auto want = reg.Find(key);
    auto got = t.FetchDigest(e.id);
    const bool whole = want && got.ok() && *got == want->digest;
    // A fetch during an eviction whose batch was not yet durable finds the
    // entry "being removed"; if the power went before that batch, the
    // entry is rightly back, and whole. Not acknowledged to anyone: allowed.
    if (whole && !want->deleted && want->evicted) {
      ++c->evicted_back;
      continue;
    }
    if (!want || want->deleted || want->evicted || !got.ok() || *got != want->digest) {
      ++c->torn;
      Say("%s: iteration %d: TORN entry %llu of %u ranks (%s)", who, it, U(e.id), e.ranks,
          !want           ? "never published"
          : want->deleted ? "deleted, and back"
          : want->evicted ? "evicted, and back"
          : !got.ok()     ? got.status().ToString().c_str()
                          : "bytes differ");
    } else if (!want->acked && unacked_seen->insert(e.id).second) {
      ++c->unacked_present;  // committed, but the crash came before the answer
    }
  }
  const auto all = reg.Snapshot();
  std::uint64_t missing = 0, deleting = 0, seen_evicted = 0;
  for (const auto& [key, a] : all) {
    if (!a.acked || a.deleted) continue;
    if (a.evicted) {  // a fetch found it gone before the crash, no delete sent: an eviction
      auto back = stored.find(key);
      if (back != stored.end() && back->second == a.entry) continue;  // its eviction never became durable
      seen_evicted += a.deleting ? 0 : 1;
      if (!a.deleting) continue;
    }
    ++c->acked_checked;
    deleting += a.deleting ? 1 : 0;
    auto at = stored.find(key);
    if (at != stored.end() && at->second == a.entry) continue;
    ++missing;
    if (path != Path::kGc)
      Say("%s: iteration %d: LOST acknowledged entry %llu (%u tokens)", who, it, U(a.entry), a.length);
  }
  if (path != Path::kGc) {
    c->lost += missing;
  } else {
    // Under a budget an acknowledged entry may be gone by an eviction (each
    // one counted durably, in the batch that made it) or by a delete sent
    // when the crash came; more gone than that (those missing now and those
    // a fetch found gone before) is lost.
    auto evictions = t.Evictions();
    const std::uint64_t allowance = (evictions.ok() ? *evictions : 0) + deleting;
    missing += seen_evicted;
    c->evicted_allowance = allowance;
    if (!evictions.ok() || missing > allowance) {
      c->lost += evictions.ok() ? missing - allowance : 1;
      Say("%s: iteration %d: LOST: %llu acknowledged entries missing, %llu evictions and deletes explain "
          "them (%s)",
          who, it, U(missing), U(allowance), evictions.ok() ? "ok" : evictions.status().ToString().c_str());
    }
  }
  if (path == Path::kBranch) CheckLookups(t, all, stored, queries, who, it, c);
}

// ---- LoopBook ----------------------------------------------------------------------------

Work LoopBook::WorkFor(int it, const std::atomic<bool>* stop) {
  Work w;
  w.path = path;
  w.who = who;
  w.seed = seed;
  w.iteration = it;
  w.epoch = epoch;
  w.reg = &reg;
  w.queries = &queries;
  w.log = &log;
  w.tally = &work;
  w.next_seed = &next_seed;
  w.stop = stop;
  return w;
}

void LoopBook::CheckSurvivors(Target& t, int it) {
  stress::CheckSurvivors(t, path, reg, queries, who, it, &unacked_seen, &check);
}

void LoopBook::NewEpoch() {
  reg.Clear();
  queries.Clear();
  unacked_seen.clear();
  ++epoch;
}

std::string LoopBook::PathFigures() const {
  switch (path) {
    case Path::kBranch:
      return " lookups_checked=" + std::to_string(check.lookups_checked);
    case Path::kGroup:
      return " groups_abandoned=" + std::to_string(work.groups_abandoned);
    case Path::kGc:
      return " fetches=" + std::to_string(work.fetches) +
             " fetch_misses=" + std::to_string(work.fetch_misses) +
             " wrong_bytes=" + std::to_string(work.wrong_bytes) + " deletes=" + std::to_string(work.deletes) +
             " compactions=" + std::to_string(work.compactions) +
             " budget_refusals=" + std::to_string(work.budget_refusals) +
             " evicted_back_whole=" + std::to_string(check.evicted_back) +
             " evictions_and_deletes_in_flight=" + std::to_string(check.evicted_allowance);
    case Path::kPlain:
      break;
  }
  return "";
}

void LoopBook::Progress(int done, double seconds) const {
  if (done % 50 != 0) return;
  Say("%s: %d iterations, %llu acknowledged, %llu lost, %llu torn, %.0f s", who, done, U(work.acked.load()),
      U(check.lost), U(check.torn), seconds);
}

}  // namespace primecache::stress
