// Writes the group-publish seeds of ipc_session_fuzzer (run by hand, its
// output committed under tests/fuzz/corpus/ipc_session_fuzzer; the stock
// capnp tool of make_ipc_seeds.sh cannot make the real encoded layers a
// group's commit checks): each seed is a client's byte stream in which one
// connection publishes parts of tensor-parallel entries (PublishBegin.group)
// made of MakeGroupParts' layers, so that the session, the store's group
// table and its gather check are reached:
//   group_two_ranks   rank 1's part committed (group pending), then rank 0's
//                     (the entry written), then the entry looked up and
//                     fetched;
//   group_abandoned   a part streamed whole and never committed (the session
//                     ends: the part is aborted);
//   group_abort       a part aborted by publishAbort;
//   group_refused     parts the store refuses: one rank, a rank past the
//                     ranks, token 0, a rank begun twice;
//   group_mismatch    two parts that do not gather (rank 1's recurrent shard
//                     holds 2 heads, rank 0's 1).
// Usage: ipc_make_group_seeds DIR
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tests/ipc/daemon_harness.h"

namespace {

using primecache::client::LayerData;
using primecache::ipc::BuildRequest;
using primecache::ipc::Flatten;
namespace wire = primecache::wire;

constexpr std::uint64_t kLen = 16;

kj::ArrayPtr<const kj::byte> KjBytes(const std::vector<std::byte>& b) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(b.data()), b.size());
}

class Stream {
 public:
  template <typename F>
  void Add(std::uint64_t id, F&& fill) {
    const auto bytes = Flatten(*BuildRequest(id, std::forward<F>(fill)));
    out_.insert(out_.end(), bytes.begin(), bytes.end());
  }
  void Hello() {
    Add(1, [](wire::Request::Builder r) {
      auto h = r.initHello();
      h.setMinVersion(1);
      h.setMaxVersion(primecache::ipc::kMaxProtocolVersion);
      h.setClient("seed");
      h.setNamespace("t");
    });
  }
  static void SetQuery(wire::Boundary::Builder b, const std::vector<std::uint32_t>& tokens) {
    auto fp = b.initFingerprint();
    fp.setDigestLo(primecache::testing::TestModel().digest.lo);
    fp.setDigestHi(primecache::testing::TestModel().digest.hi);
    fp.setName(primecache::testing::TestModel().name);
    b.setNamespace("t");
    auto t = b.initTokens(static_cast<unsigned>(tokens.size()));
    for (unsigned i = 0; i < tokens.size(); ++i) t.set(i, tokens[i]);
    b.setLength(static_cast<std::uint32_t>(tokens.size()));
  }
  // A publish of `part` as rank `rank` of `ranks` under `token`, begun with
  // request id `id` (its later messages name it); committed when `commit`.
  void Part(std::uint64_t id, const std::vector<std::uint32_t>& tokens, std::uint64_t token,
            std::uint32_t ranks, std::uint32_t rank, const std::vector<LayerData>& part, bool commit) {
    Add(id, [&](wire::Request::Builder r) {
      auto pb = r.initPublishBegin();
      SetQuery(pb.initBoundary(), tokens);
      pb.setLayerCount(static_cast<std::uint32_t>(part.size()));
      auto g = pb.initGroup();
      g.setToken(token);
      g.setRanks(ranks);
      g.setRank(rank);
    });
    std::uint64_t next = id + 1;
    for (std::uint32_t l = 0; l < part.size(); ++l) {
      Add(next++, [&](wire::Request::Builder r) {
        auto pl = r.initPublishLayer();
        pl.setPublish(id);
        pl.setLayer(l);
        pl.setHeader(KjBytes(part[l].header));
        pl.setChunkCount(static_cast<std::uint32_t>(part[l].chunks.size()));
      });
      for (std::uint32_t c = 0; c < part[l].chunks.size(); ++c) {
        Add(next++, [&](wire::Request::Builder r) {
          auto pc = r.initPublishChunk();
          pc.setPublish(id);
          pc.setLayer(l);
          pc.setIndex(c);
          pc.initData().setInline(KjBytes(part[l].chunks[c]));
        });
      }
    }
    if (commit) Add(next, [&](wire::Request::Builder r) { r.initPublishCommit().setPublish(id); });
  }
  void Write(const std::string& path) const {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(out_.data()), static_cast<std::streamsize>(out_.size()));
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      std::exit(1);
    }
  }

 private:
  std::vector<std::byte> out_;
};

// Rank `rank`'s shard of a recurrent layer of 4 heads cut for 2 ranks: 2
// heads, where MakeGroupParts' shards hold 1.
std::vector<LayerData> WiderShard(std::uint32_t rank) {
  auto snap = primecache::MakeSnapshot(primecache::RecurrentShape{4, 8, 4});
  if (!snap.ok()) std::abort();
  auto& rec = std::get<primecache::RecurrentSnapshot>(*snap);
  for (std::size_t i = 0; i < rec.state.size(); ++i) rec.state[i] = static_cast<float>(i % 97) * 0.25f;
  auto shard = primecache::SliceRecurrent(rec, 2, rank);
  if (!shard.ok()) std::abort();
  primecache::EncodeOptions eo;
  eo.all_planes = primecache::TransformSpec{std::string(primecache::kRawTransform), 0};
  auto enc = primecache::EncodeLayer(primecache::LayerSnapshot{*shard}, eo);
  if (!enc.ok()) std::abort();
  return {primecache::testing::ToLayerData(*enc)};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  using primecache::testing::MakeGroupParts;
  using primecache::testing::Tokens;
  const auto tokens = Tokens(kLen, 3);
  const auto parts = MakeGroupParts(kLen, 5);
  {
    Stream s;
    s.Hello();
    s.Part(10, tokens, 77, 2, 1, parts[1], true);
    s.Part(20, tokens, 77, 2, 0, parts[0], true);
    s.Add(40, [&](wire::Request::Builder r) {
      auto l = r.initLookup();
      l.setWantShared(true);
      Stream::SetQuery(l.initQuery(), tokens);
    });
    // By entry: a fetch by query's fetchHit would read, to session_answer_test's
    // replay of these seeds, as a second answer. Entry 1 in a fresh store.
    s.Add(41, [&](wire::Request::Builder r) { r.initFetch().setEntry(1); });
    s.Write(dir + "/group_two_ranks");
  }
  {
    Stream s;
    s.Hello();
    s.Part(10, Tokens(kLen, 4), 78, 2, 0, parts[0], false);
    s.Write(dir + "/group_abandoned");
  }
  {
    Stream s;
    s.Hello();
    s.Part(10, Tokens(kLen, 5), 79, 2, 1, parts[1], false);
    s.Add(20, [](wire::Request::Builder r) { r.initPublishAbort().setPublish(10); });
    s.Write(dir + "/group_abort");
  }
  {
    Stream s;
    s.Hello();
    const auto t = Tokens(kLen, 6);
    s.Part(10, t, 80, 1, 0, parts[0], true);  // one rank
    s.Part(20, t, 80, 2, 2, parts[1], true);  // a rank past the ranks
    s.Part(30, t, 0, 2, 1, parts[1], true);   // token 0
    s.Part(40, t, 81, 2, 1, parts[1], false);
    s.Part(50, t, 81, 2, 1, parts[1], true);  // rank 1 of token 81 begun twice
    s.Write(dir + "/group_refused");
  }
  {
    Stream s;
    s.Hello();
    const auto t = Tokens(kLen, 7);
    s.Part(10, t, 82, 2, 0, parts[0], true);
    s.Part(20, t, 82, 2, 1, WiderShard(1), true);
    s.Write(dir + "/group_mismatch");
  }
  std::printf("group seeds written to %s\n", dir.c_str());
  return 0;
}
