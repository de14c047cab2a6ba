// Answers within one publish come in request order (docs/protocol.md), the
// refusal of a step that breaks the publish's order included: against the
// real primecached, each case pipelines valid steps, the step that breaks the
// order and one more step, without waiting for any answer, many times over.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/ipc/daemon_harness.h"

namespace primecache::testing {
namespace {

constexpr int kTries = 20;
// Big enough that staging it keeps the publish's queue busy a while.
constexpr std::size_t kChunkBytes = 64 * 1024;

// One case: `send` pipelines five requests of publish `pub` (ids pub ..
// pub + 4): publishBegin and two valid steps, the step that breaks the
// order (refused naming `refusal`), and a step after it (no open publish).
struct OrderCase {
  std::string name;
  std::function<bool(RawConn&, std::uint64_t pub)> send;
  std::string refusal;
};

std::vector<OrderCase> Cases() {
  return {
      {"a layer out of order",
       [](RawConn& c, std::uint64_t pub) {
         return SendBegin(c, pub, 3, 1) && SendLayer(c, pub + 1, pub, 0, 1) &&
                SendChunk(c, pub + 2, pub, 0, 0, kChunkBytes) && SendLayer(c, pub + 3, pub, 2, 1) &&
                SendChunk(c, pub + 4, pub, 2, 0, kChunkBytes);
       },
       "expected layer 1, got 2"},
      {"a skipped chunk index",
       [](RawConn& c, std::uint64_t pub) {
         return SendBegin(c, pub, 1, 2) && SendLayer(c, pub + 1, pub, 0, 3) &&
                SendChunk(c, pub + 2, pub, 0, 0, kChunkBytes) && SendChunk(c, pub + 3, pub, 0, 2, kChunkBytes) &&
                SendChunk(c, pub + 4, pub, 0, 1, kChunkBytes);
       },
       "expected chunk 1 of layer 0, got chunk 2 of layer 0"},
      {"a commit before the layers",
       [](RawConn& c, std::uint64_t pub) {
         return SendBegin(c, pub, 2, 3) && SendLayer(c, pub + 1, pub, 0, 1) &&
                SendChunk(c, pub + 2, pub, 0, 0, kChunkBytes) && SendCommit(c, pub + 3, pub) &&
                SendLayer(c, pub + 4, pub, 1, 1);
       },
       "commit before every layer and chunk arrived: 1 of 2 layers"},
  };
}

TEST(PublishOrder, AnOrderErrorIsAnsweredAfterTheStepsBeforeIt) {
  Daemon d;
  ASSERT_TRUE(d.Start());
  auto admin = Admin(d);
  ASSERT_NE(admin, nullptr);
  RawConn r(d.socket());
  ASSERT_TRUE(r.Hello());
  std::uint64_t pub = 100;
  for (const OrderCase& c : Cases()) {
    int out_of_order = 0;
    std::string first_seen;  // the ids of the first try out of order
    for (int t = 0; t < kTries; ++t, pub += 10) {
      ASSERT_TRUE(c.send(r, pub)) << c.name;
      std::vector<Reply> got;
      std::string ids;
      for (int i = 0; i < 5; ++i) {
        auto reply = NextReply(r);
        ASSERT_TRUE(reply.has_value()) << c.name << ", try " << t << ": answer " << i << " never came";
        got.push_back(*reply);
        ids += " " + std::to_string(reply->id - pub);
      }
      bool in_order = true;
      for (std::size_t i = 0; i < got.size(); ++i) in_order = in_order && got[i].id == pub + i;
      if (!in_order) {
        if (out_of_order++ == 0) first_seen = ids;
        continue;
      }
      for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i].which, wire::Response::ACK) << c.name << ": " << got[i].message;
      EXPECT_EQ(got[3].which, wire::Response::ERROR) << c.name;
      EXPECT_EQ(got[3].code, wire::ErrorCode::INVALID_ARGUMENT) << c.name << ": " << got[3].message;
      EXPECT_NE(got[3].message.find(c.refusal), std::string::npos) << c.name << ": " << got[3].message;
      // The daemon refuses the publish's steps after the refusal.
      EXPECT_EQ(got[4].code, wire::ErrorCode::NOT_FOUND) << c.name << ": " << got[4].message;
      EXPECT_NE(got[4].message.find("no open publish " + std::to_string(pub)), std::string::npos) << got[4].message;
    }
    EXPECT_EQ(out_of_order, 0) << c.name << ": answers out of request order in " << out_of_order << " of " << kTries
                               << " tries (the first: steps" << first_seen << ", expected 0 1 2 3 4)";
  }
  // Every refused publish was aborted: nothing counted, nothing stored.
  EXPECT_TRUE(StatBecomes(*admin, [](const DaemonStats& s) { return s.uncommitted_bytes == 0 && s.publishes_in_flight == 0; }));
  auto st = admin->Stat();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->store.entries, 0u);
}

}  // namespace
}  // namespace primecache::testing
