// The child of the crash tests: opens the store at argv[1], runs the crash
// workload, and writes "ACK <step> <kind> <id>" to stdout after each step is
// acknowledged. The parent kills it (a kill point armed through the
// environment, or SIGKILL at a random time) and checks the store.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "primecache/internal/codec.h"
#include "crash_workload.h"

namespace {

void Say(const std::string& line) {
  std::string l = line + "\n";
  ssize_t ignored = ::write(1, l.data(), l.size());
  (void)ignored;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace primecache;  // NOLINT(google-build-using-namespace)
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  StoreOptions o;
  o.validator = CodecLayerValidator();
  o.path = argv[1];
  o.segment_bytes = crash_test::kSegmentBytes;
  auto store = LocalStore::Open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    return 1;
  }
  const auto& steps = crash_test::Workload();
  std::vector<EntryId> ids(steps.size(), 0);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    switch (s.kind) {
      case crash_test::Step::kPublish: {
        auto layers = store_test::MakeLayers(s.tokens, crash_test::Model());
        auto r = (*store)->Publish(store_test::Request(s.tokens), layers);
        if (!r.ok()) {
          std::fprintf(stderr, "step %zu: %s\n", i, r.status().ToString().c_str());
          return 1;
        }
        ids[i] = r->id;
        Say("ACK " + std::to_string(i) + " publish " + std::to_string(r->id));
        break;
      }
      case crash_test::Step::kGroupPublish: {
        auto parts = store_test::MakeGroupParts(s.tokens, crash_test::kGroupRanks, crash_test::Model());
        EntryId id = 0;
        for (std::uint32_t rank : {1u, 0u}) {
          PublishRequest req = store_test::Request(s.tokens);
          req.group = PublishGroup{0x7700 + i, crash_test::kGroupRanks, rank};
          auto start = (*store)->BeginPublish(std::move(req));
          Status st = start.status();
          for (std::size_t l = 0; st.ok() && l < parts[rank].size(); ++l) st = start->publisher->AddLayer(parts[rank][l]);
          Result<PublishResult> r = st.ok() ? start->publisher->Commit() : Result<PublishResult>(st);
          if (!r.ok()) {
            std::fprintf(stderr, "step %zu rank %u: %s\n", i, rank, r.status().ToString().c_str());
            return 1;
          }
          id = r->id;
        }
        ids[i] = id;
        Say("ACK " + std::to_string(i) + " publish " + std::to_string(id));
        break;
      }
      case crash_test::Step::kDelete: {
        Status st = (*store)->Delete(ids[s.target]);
        if (!st.ok()) {
          std::fprintf(stderr, "step %zu: %s\n", i, st.ToString().c_str());
          return 1;
        }
        Say("ACK " + std::to_string(i) + " delete " + std::to_string(ids[s.target]));
        break;
      }
      case crash_test::Step::kEvict: {
        ListOptions lo;
        lo.limit = 1000;
        auto before = (*store)->List(lo);
        auto st = (*store)->Stat();
        if (!before.ok() || !st.ok()) return 1;
        Status e = (*store)->SetByteBudget(st->stored_bytes - 1);
        if (!e.ok()) {
          std::fprintf(stderr, "step %zu: %s\n", i, e.ToString().c_str());
          return 1;
        }
        // Report which entry went; then lift the budget again.
        for (auto& entry : before->entries) {
          if (!(*store)->Describe(entry.id).ok())
            Say("ACK " + std::to_string(i) + " evict " + std::to_string(entry.id));
        }
        if (!(*store)->SetByteBudget(0).ok()) return 1;
        break;
      }
      case crash_test::Step::kCompact: {
        Status c = (*store)->Compact();
        if (!c.ok()) {
          std::fprintf(stderr, "step %zu: %s\n", i, c.ToString().c_str());
          return 1;
        }
        Say("ACK " + std::to_string(i) + " compact 0");
        break;
      }
    }
  }
  return 0;
}
