// Writes a small store and the digests of what its entries must fetch as,
// for the migration tests (tests/statestore/migrate_test.cc).
//
// The fixtures under tests/statestore/fixtures/ were written with this
// program built from the tree before schema 3 (commit d47a6ce, schema 2):
//   make_fixture DIR blob|pieces
// Built from a later tree it writes a store of that tree's schema; it is
// kept to show how the fixtures were made.
//
// DIR/store is the store; DIR/expected.txt has one line per live entry:
//   <entry id> <model n> <token count> <seed> <XXH3-128 hex of every layer's header and chunks>
#include <cstdio>
#include <fstream>
#include <string>

#include "store_test_util.h"

namespace {

using namespace primecache;               // NOLINT(google-build-using-namespace)
using namespace primecache::store_test;  // NOLINT(google-build-using-namespace)

std::string DigestOf(const std::vector<LayerBytes>& layers) {
  std::string all;
  for (const auto& l : layers) {
    all += l.header;
    for (const auto& c : l.chunks) all += c;
  }
  Hash128 h = Checksum128(std::as_bytes(std::span(all.data(), all.size())));
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.hi),
                static_cast<unsigned long long>(h.lo));
  return buf;
}

int Run(const std::string& dir, bool pieces) {
  StoreOptions o;
  o.path = dir + "/store";
  o.chunk_layout = pieces ? ChunkLayout::kPieces : ChunkLayout::kBlobFiles;
  o.piece_bytes = 4096;
  o.direct_write_bytes = 8 << 10;  // some chunks past the WAL too
  auto store = Store::Open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  TestModel m;
  m.chunk_bytes = 6000;  // over min_blob_size, and more than one piece
  struct Made {
    EntryId id;
    std::uint64_t model, n, seed;
  };
  std::vector<Made> made;
  auto publish = [&](std::uint64_t model, std::uint64_t n, std::uint64_t seed) {
    auto tokens = Prefix(Conversation(400, seed), n);
    EntryId id = MustPublish(**store, tokens, model, "", m);
    made.push_back({id, model, n, seed});
  };
  publish(1, 120, 11);
  publish(1, 260, 11);  // shares the first one's leading chunks
  publish(1, 200, 12);
  publish(2, 150, 13);
  publish(1, 90, 14);
  if (!(*store)->Delete(made[4].id).ok()) return 1;  // its chunks become dead bytes
  made.pop_back();
  if (!(*store)->Compact().ok()) return 1;  // chunks in blob/SST files, not only the log
  std::ofstream out(dir + "/expected.txt");
  for (const auto& e : made) {
    auto layers = (*store)->FetchAll(e.id);
    if (!layers.ok()) return 1;
    out << e.id << ' ' << e.model << ' ' << e.n << ' ' << e.seed << ' ' << DigestOf(*layers) << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_fixture DIR blob|pieces\n");
    return 2;
  }
  return Run(argv[1], std::string(argv[2]) == "pieces");
}
