// Group publish programs: a byte string read as a sequence of the steps the
// ranks of tensor-parallel engines take against one store (begin a part,
// send a layer, commit, end a part without committing, reopen the store),
// over three groups of 2 or 4 ranks (an op byte: bits 0-1 the step, 2-3
// the group, 4-6 the rank, bit 7 an end instead of a commit; the first
// three bytes pick each group's rank count). A model of the protocol says what each
// step must answer; after every step, and at the end, the program checks
// that an entry is visible exactly when every rank of its group committed,
// that a visible entry holds every part's layers in rank order, and, once
// every part is over, that no staged byte is left and the store is
// consistent. Run by group_program_test.cc (seeded programs) and
// group_fuzzer.cc (libFuzzer).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include "store_test_util.h"

namespace primecache::store_test {

class GroupProgram {
 public:
  // The violations found (empty: none).
  std::vector<std::string> Run(const std::uint8_t* data, std::size_t size) {
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      Group& grp = groups_[g];
      grp.ranks = (size > g && (data[g] & 1)) ? 4 : 2;
      grp.tokens = Conversation(40 + 8 * g, 900 + g);
      grp.parts = PartsOf(g, grp.ranks, grp.tokens);
      grp.pubs.resize(grp.ranks);
      grp.sent.assign(grp.ranks, 0);
      grp.state.assign(grp.ranks, Part::kNone);
    }
    // At most kMaxSteps steps: longer inputs add nothing a shorter one cannot reach.
    for (std::size_t i = kGroups; i < size && i < kGroups + kMaxSteps && errors_.empty(); ++i) Step(data[i]);
    for (Group& grp : groups_) {
      for (auto& p : grp.pubs) p.reset();
    }
    CheckVisible("at the end");
    // A group whose parts are parked waits for its missing ranks until its
    // deadline; closing the store gives them back too.
    store_.Reopen();
    if (auto st = store_.store->Stat(); !st.ok() || st->staged_bytes != 0) {
      Error("staged bytes left once every part ended");
    }
    CheckVisible("after a reopen");
    auto check = store_.store->CheckStore({.read_chunks = true});
    if (!check.ok()) Error("CheckStore: " + check.status().ToString());
    if (check.ok()) {
      for (const auto& p : check->problems) Error("CheckStore: " + p);
    }
    return errors_;
  }

  // Groups whose entry the program stored, and attempts that ended aborted.
  std::uint32_t committed() const {
    std::uint32_t n = 0;
    for (const Group& g : groups_) n += g.committed ? 1 : 0;
    return n;
  }
  std::uint64_t aborted() const { return aborted_; }

 private:
  static constexpr std::uint32_t kGroups = 3;
  static constexpr std::size_t kMaxSteps = 256;
  enum class Part : std::uint8_t { kNone, kStreaming, kParked };
  struct Group {
    std::uint32_t ranks = 2;
    std::vector<std::uint32_t> tokens;
    std::vector<std::vector<LayerBytes>> parts;
    std::uint64_t token = 1;  // this attempt's group token
    std::vector<std::unique_ptr<Publisher>> pubs;
    std::vector<std::size_t> sent;  // layers each rank sent
    std::vector<Part> state;
    bool committed = false;  // the entry is stored: later attempts find it
  };

  // Group g's parts at `ranks` ranks, encoded once per process (they depend
  // on nothing else), so that a program costs its store's work alone.
  static const std::vector<std::vector<LayerBytes>>& PartsOf(std::uint32_t g, std::uint32_t ranks,
                                                            const std::vector<std::uint32_t>& tokens) {
    static std::map<std::pair<std::uint32_t, std::uint32_t>, std::vector<std::vector<LayerBytes>>> cache;
    auto [it, fresh] = cache.try_emplace({g, ranks});
    if (fresh) it->second = MakeGroupParts(tokens, ranks, Model());
    return it->second;
  }

  static TestModel Model() {
    TestModel m;
    m.heads = 4;
    m.recurrent_layers = 2;
    return m;
  }

  void Error(const std::string& what) { errors_.push_back(what); }

  // A new attempt after an abort: every part over, a new token.
  void Restart(Group& g) {
    bool begun = false;
    for (Part p : g.state) begun = begun || p != Part::kNone;
    aborted_ += begun ? 1 : 0;
    for (auto& p : g.pubs) p.reset();
    g.sent.assign(g.ranks, 0);
    g.state.assign(g.ranks, Part::kNone);
    ++g.token;
  }

  void Step(std::uint8_t op) {
    Group& g = groups_[((op >> 2) & 3) % kGroups];
    const std::uint32_t rank = (op >> 4) % g.ranks;
    switch (op & 3) {
      case 0:
        Begin(g, rank);
        break;
      case 1:
        Send(g, rank);
        break;
      case 2:
        (op & 0x80) ? End(g, rank) : Commit(g, rank);
        break;
      case 3:
        if ((op & 0xf0) == 0xf0) {
          Reopen();
        } else {
          Send(g, rank);
        }
        break;
    }
    CheckVisible("after step " + std::to_string(op));
  }

  void Begin(Group& g, std::uint32_t rank) {
    if (g.state[rank] != Part::kNone) return;
    PublishRequest r = Request(g.tokens);
    r.group = PublishGroup{g.token, g.ranks, rank};
    auto start = store_.store->BeginPublish(std::move(r));
    if (!start.ok()) return Error("begin of rank " + std::to_string(rank) + ": " + start.status().ToString());
    if (g.committed != (start->publisher == nullptr))
      return Error("begin: stored or not, the store disagrees");
    if (g.committed) return;
    g.pubs[rank] = std::move(start->publisher);
    g.state[rank] = Part::kStreaming;
  }

  void Send(Group& g, std::uint32_t rank) {
    if (g.state[rank] != Part::kStreaming || g.sent[rank] == g.parts[rank].size()) return;
    Status s = g.pubs[rank]->AddLayer(g.parts[rank][g.sent[rank]++]);
    if (!s.ok()) Error("layer of rank " + std::to_string(rank) + ": " + s.ToString());
  }

  void Commit(Group& g, std::uint32_t rank) {
    if (g.state[rank] != Part::kStreaming || g.sent[rank] != g.parts[rank].size()) return;
    std::uint32_t parked = 0;
    for (Part p : g.state) parked += p == Part::kParked ? 1 : 0;
    auto r = g.pubs[rank]->Commit();
    g.pubs[rank].reset();
    if (!r.ok()) return Error("commit of rank " + std::to_string(rank) + ": " + r.status().ToString());
    const bool last = parked + 1 == g.ranks;
    if (r->group_pending == last) return Error("commit: pending or not, the store disagrees with the model");
    g.state[rank] = Part::kParked;
    if (last) {
      g.committed = true;
      auto back = store_.store->FetchAll(r->id);
      if (!back.ok()) return Error("fetch of a committed group: " + back.status().ToString());
      const auto want = Concat(g.parts);
      if (back->size() != want.size()) return Error("a committed group's layers are not its parts'");
      for (std::size_t l = 0; l < want.size(); ++l) {
        if ((*back)[l].header != want[l].header || (*back)[l].chunks != want[l].chunks) {
          return Error("layer " + std::to_string(l) + " of a committed group is not its part's");
        }
      }
    }
  }

  // A rank ends its part without committing: the attempt is over.
  void End(Group& g, std::uint32_t rank) {
    if (g.state[rank] != Part::kStreaming) return;
    Restart(g);
  }

  // The store closes (every part ends) and opens again.
  void Reopen() {
    for (Group& g : groups_) {
      if (!g.committed) Restart(g);
    }
    store_.Reopen();
  }

  void CheckVisible(const std::string& when) {
    for (std::uint32_t i = 0; i < kGroups; ++i) {
      const Group& g = groups_[i];
      auto hit = store_.store->Lookup(ModelDigest(1), "", g.tokens, {.record = false});
      if (!hit.ok()) return Error("lookup: " + hit.status().ToString());
      const bool exact = *hit && (*hit)->length == g.tokens.size();
      if (exact != g.committed) {
        return Error("group " + std::to_string(i) +
                     (g.committed ? " committed but not visible " : " visible ") + when);
      }
      if (exact && (*hit)->ranks != g.ranks) return Error("a group entry's rank count is not its group's");
    }
  }

  MemStore store_;
  std::array<Group, kGroups> groups_;
  std::vector<std::string> errors_;
  std::uint64_t aborted_ = 0;
};

}  // namespace primecache::store_test
