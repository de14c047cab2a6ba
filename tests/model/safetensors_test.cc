#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "primecache/internal/model.h"

namespace primecache::model {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  c.name = "t";
  c.vocab = 258;
  c.hidden = 8;
  c.mlp_hidden = 12;
  c.layers = {LayerType::kKda, LayerType::kMla};
  c.mla = {2, 4, 2, 3, 3, 10000.0f, IndexerConfig{1, 4, 2, 2}};
  c.kda = {2, 4, 3, -5.0f};
  return c;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = NewMemEnv();
    ASSERT_TRUE(env_->CreateDir("/w").ok());
  }
  // Writes a file: 8-byte length, header, then `data` bytes.
  void WriteRaw(const std::string& header, std::size_t data_bytes) {
    std::string out(8, '\0');
    std::uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    out += header;
    out.append(data_bytes, '\0');
    ASSERT_TRUE(WriteFileAtomically(env_.get(), "/w/x.safetensors", out).ok());
  }
  Status Load() { return LoadSafetensors(env_.get(), "/w/x.safetensors").status(); }
  std::unique_ptr<Env> env_;
};

TEST_F(SafetensorsTest, RoundTripIsExact) {
  ModelConfig c = Tiny();
  Weights w = Weights::Generate(c, 7);
  ASSERT_TRUE(w.CheckAgainst(c).ok());
  ASSERT_TRUE(SaveSafetensors(env_.get(), "/w/m.safetensors", w).ok());
  auto back = LoadSafetensors(env_.get(), "/w/m.safetensors");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->CheckAgainst(c).ok());
  EXPECT_EQ(back->Digest(), w.Digest());
  for (const auto& [name, t] : w.tensors()) {
    const Tensor* u = back->Find(name);
    ASSERT_NE(u, nullptr);
    EXPECT_EQ(u->shape, t.shape);
    EXPECT_EQ(std::memcmp(u->data.data(), t.data.data(), t.data.size() * 4), 0) << name;
  }
}

TEST_F(SafetensorsTest, GenerationIsDeterministicAndSeeded) {
  ModelConfig c = Tiny();
  EXPECT_EQ(Weights::Generate(c, 1).Digest(), Weights::Generate(c, 1).Digest());
  EXPECT_NE(Weights::Generate(c, 1).Digest(), Weights::Generate(c, 2).Digest());
  // A tensor's values depend on its name only, not on the other tensors.
  ModelConfig more = c;
  more.layers.push_back(LayerType::kKda);
  EXPECT_EQ(Weights::Generate(c, 1).Find("layers.0.kda.wq")->data,
            Weights::Generate(more, 1).Find("layers.0.kda.wq")->data);
}

TEST_F(SafetensorsTest, CheckAgainstNamesWhatIsWrong) {
  ModelConfig c = Tiny();
  auto tensors = Weights::Generate(c, 1).tensors();
  auto missing = tensors;
  missing.erase("layers.1.mla.idx.ape");
  EXPECT_NE(Weights(missing).CheckAgainst(c).message().find("lack tensor layers.1.mla.idx.ape"), std::string::npos);
  auto reshaped = tensors;
  reshaped["lm_head"].shape = {8, 258};
  EXPECT_NE(Weights(reshaped).CheckAgainst(c).message().find("lm_head has shape [8, 258]"), std::string::npos);
  auto extra = tensors;
  extra["bogus"] = Tensor{{1}, {0.0f}};
  EXPECT_NE(Weights(extra).CheckAgainst(c).message().find("unexpected tensor bogus"), std::string::npos);
  auto nan = tensors;
  nan["embed"].data[3] = NAN;
  EXPECT_NE(Weights(nan).CheckAgainst(c).message().find("non-finite"), std::string::npos);
}

TEST_F(SafetensorsTest, RefusesDamage) {
  struct Case {
    std::string header;
    std::size_t data;
    const char* needle;
  } cases[] = {
      {R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4, "only F32"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "shape needs 8"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "past the end"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", 8, "overlaps"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "belong to no tensor"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 12, "belong to no tensor"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "non-negative"},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4, "overflows"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "data_offsets"},
      {R"({"a":[1,2]})", 0, "not an object"},
      {"{not json", 0, "not a JSON object"},
  };
  for (const auto& c : cases) {
    WriteRaw(c.header, c.data);
    Status s = Load();
    ASSERT_FALSE(s.ok()) << c.header;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << c.header << " -> " << s.message();
  }
}

TEST_F(SafetensorsTest, RefusesHeaderLengthsThatLie) {
  std::string out(8, '\0');
  std::uint64_t n = 1ull << 40;
  std::memcpy(out.data(), &n, 8);
  out += "{}";
  ASSERT_TRUE(WriteFileAtomically(env_.get(), "/w/x.safetensors", out).ok());
  EXPECT_NE(Load().message().find("exceeds the limit"), std::string::npos);
  n = 100;
  std::memcpy(out.data(), &n, 8);
  ASSERT_TRUE(WriteFileAtomically(env_.get(), "/w/x.safetensors", out).ok());
  EXPECT_NE(Load().message().find("past the end of the file"), std::string::npos);
  ASSERT_TRUE(WriteFileAtomically(env_.get(), "/w/x.safetensors", "abc").ok());
  EXPECT_NE(Load().message().find("too short"), std::string::npos);
}

}  // namespace
}  // namespace primecache::model
