// The tensor-parallel model on CUDA: the NCCL group's sum on a device, its
// refusal of two ranks on one device (NCCL needs distinct devices), TP 1 on
// CUDA bit-identical to the plain CUDA model, and, where the host has two
// devices or more, TP 2 within the spec's tolerance of TP 1 on CUDA.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>

#include "engine/model/tensor_parallel.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/model/model_test_util.h"
#include "tests/model/step_compare.h"

namespace primecache::model {
namespace {

using primecache::testing::DeviceBuffer;

int CudaDevices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

ModelConfig TpMedium() {
  ModelConfig c = testing::Medium();  // heads 8 (MLA), 4 (KDA), mlp_hidden 512: TP 1, 2 and 4 divide them
  c.name = "tp-medium";
  return c;
}

TpModelOptions CudaOptions(std::uint32_t tp, std::vector<int> devices = {}) {
  TpModelOptions o;
  o.tp = tp;
  o.reserve.max_ctx = 256;
  o.reserve.sessions = 1;
  o.reserve.snapshot_slots = 1;
  o.model.chunk_tokens = 64;
  o.backend = engine::DeviceKind::kCuda;
  o.cuda_devices = std::move(devices);
  return o;
}

std::vector<float> PrimeAt(const ModelConfig& c, const Weights& w, TpModelOptions options,
                           const std::vector<std::uint32_t>& prompt) {
  auto m = TensorParallelModel::Create(c, w, std::move(options));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return {};
  TpSession s = (*m)->NewSession().value();
  std::vector<float> logits;
  Status st = (*m)->Prime(s, prompt, LogitsWanted::kAll, &logits);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return logits;
}

TEST(TensorParallelGpu, AnNcclGroupOfOneDeviceSumsInPlace) {
  PC_SKIP_WITHOUT_CUDA();
  cudaStream_t stream = nullptr;
  PC_CUDA_OK(cudaSetDevice(0));
  PC_CUDA_OK(cudaStreamCreate(&stream));
  auto group = NewNcclGroup({0}, {stream});
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f};
  DeviceBuffer<float> buf(values.size());
  PC_CUDA_OK(buf.Upload(values));
  ASSERT_TRUE((*group)->rank(0).AllReduceSum(buf.get(), values.size()).ok());
  PC_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<float> back;
  PC_CUDA_OK(buf.Download(&back));
  EXPECT_EQ(back, values);
  EXPECT_EQ((*group)->rank(0).memory(), engine::DeviceKind::kCuda);
  group->reset();
  PC_CUDA_OK(cudaStreamDestroy(stream));
}

TEST(TensorParallelGpu, TwoRanksOnOneDeviceAreRefusedCleanly) {
  PC_SKIP_WITHOUT_CUDA();
  const ModelConfig c = TpMedium();
  const Weights w = Weights::Generate(c, 3);
  auto m = TensorParallelModel::Create(c, w, CudaOptions(2, {0, 0}));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("ncclCommInitAll"), std::string::npos) << m.status().ToString();
  auto short_list = TensorParallelModel::Create(c, w, CudaOptions(2, {0}));
  EXPECT_EQ(short_list.status().message(), "TP 2 needs 2 CUDA devices, 1 given");
}

TEST(TensorParallelGpu, TpOneOnCudaIsThePlainCudaModelBitForBit) {
  PC_SKIP_WITHOUT_CUDA();
  const ModelConfig c = TpMedium();
  const Weights w = Weights::Generate(c, 5);
  const auto prompt = testing::RandomPrompt(150, 7);
  auto plain = testing::MakeCudaModel(c, w, 256, 64, 1).value();
  ModelSession s = plain.model->NewSession().value();
  std::vector<float> want;
  ASSERT_TRUE(plain.model->Prime(s, prompt, LogitsWanted::kAll, &want).ok());
  EXPECT_EQ(PrimeAt(c, w, CudaOptions(1), prompt), want);
}

TEST(TensorParallelGpu, TpTwoOnTwoDevicesAgreesWithTpOneWithinTheTolerance) {
  PC_SKIP_WITHOUT_CUDA();
  if (CudaDevices() < 2) GTEST_SKIP() << "one CUDA device: TP 2 over NCCL needs two";
  const ModelConfig c = TpMedium();
  const Weights w = Weights::Generate(c, 9);
  const auto prompt = testing::RandomPrompt(150, 11);
  const std::vector<float> one = PrimeAt(c, w, CudaOptions(1), prompt);
  const std::vector<float> two = PrimeAt(c, w, CudaOptions(2), prompt);
  ASSERT_EQ(two.size(), one.size());
  EXPECT_LE(testing::RelErr(two, one), 1e-4);
}

}  // namespace
}  // namespace primecache::model
