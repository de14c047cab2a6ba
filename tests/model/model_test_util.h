// Test helpers: a CPU engine and model for a configuration.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "engine/model/hybrid_model.h"
#include "engine/model/tensor_parallel.h"

namespace primecache::model::testing {

// An engine and the model over it, on one device.
struct EngineModel {
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<HybridModel> model;
};
using CpuModel = EngineModel;  // on the CPU reference device

// An engine on `device` reserved for `sessions` sessions of max_ctx tokens
// (an index ring of ring_rows, rounds of round_tokens), and the model over
// it, run in chunks of `chunk` tokens.
inline Result<EngineModel> MakeModelOn(std::shared_ptr<engine::Device> device, const ModelConfig& c,
                                       const Weights& w, std::uint64_t max_ctx, std::size_t chunk,
                                       std::uint32_t sessions, std::uint64_t ring_rows = 0,
                                       std::uint32_t round_tokens = 0) {
  engine::ReserveRequest req;
  req.plan = HybridModel::PlanFor(c, w);
  req.max_ctx = max_ctx;
  req.sessions = sessions;
  req.snapshot_slots = 1;
  req.index_ring_rows = ring_rows;
  req.round_tokens = round_tokens;
  EngineModel m;
  PC_ASSIGN_OR_RETURN(m.engine, engine::Engine::Create(std::move(device), req));
  PC_ASSIGN_OR_RETURN(m.model, HybridModel::Create(c, w, m.engine.get(), {chunk}));
  return m;
}

inline Result<CpuModel> MakeCpuModel(const ModelConfig& c, const Weights& w, std::uint64_t max_ctx = 256,
                                     std::size_t chunk = 64, std::uint32_t sessions = 2,
                                     std::uint64_t ring_rows = 0, std::uint32_t round_tokens = 0) {
  return MakeModelOn(engine::NewCpuDevice(), c, w, max_ctx, chunk, sessions, ring_rows, round_tokens);
}

// The same on a new CUDA device (an error where there is none).
inline Result<EngineModel> MakeCudaModel(const ModelConfig& c, const Weights& w, std::uint64_t max_ctx,
                                         std::size_t chunk, std::uint32_t sessions, std::uint64_t ring_rows = 0,
                                         std::uint32_t round_tokens = 0) {
  PC_ASSIGN_OR_RETURN(auto device, engine::NewCudaDevice());
  return MakeModelOn(std::move(device), c, w, max_ctx, chunk, sessions, ring_rows, round_tokens);
}

// BOS, then n - 1 pseudo-random bytes from `seed`.
inline std::vector<std::uint32_t> RandomPrompt(std::size_t n, std::uint32_t seed) {
  std::vector<std::uint32_t> t{kBosToken};
  std::mt19937 rng(seed);
  while (t.size() < n) t.push_back(rng() % 256);
  return t;
}

// A small mixed stack (KDA, MLA with indexer, KDA, MLA) the CPU tests share.
inline ModelConfig Mixed() {
  ModelConfig c;
  c.name = "mixed";
  c.vocab = 258;
  c.hidden = 32;
  c.mlp_hidden = 48;
  c.layers = {LayerType::kKda, LayerType::kMla, LayerType::kKda, LayerType::kMla};
  c.mla = {3, 16, 4, 8, 8, 10000.0f, IndexerConfig{2, 8, 4, 2}};
  c.kda = {2, 8, 4, -5.0f};
  return c;
}

// A medium mixed stack (KDA, MLA with indexer, KDA, MLA at hidden 256): the
// CPU oracle test's and the GPU tests' model.
inline ModelConfig Medium() {
  ModelConfig c;
  c.name = "medium";
  c.vocab = 300;
  c.hidden = 256;
  c.mlp_hidden = 512;
  c.layers = {LayerType::kKda, LayerType::kMla, LayerType::kKda, LayerType::kMla};
  c.mla = {8, 128, 32, 32, 32, 10000.0f, IndexerConfig{4, 64, 4, 8}};
  c.kda = {4, 64, 4, -5.0f};
  return c;
}

// A small stack with every mixer, its heads divided by 1, 2 and 4: KDA, MLA
// with a sparse indexer, grouped attention (window 0: full; bits:
// TurboQuant), the TP tests' model.
inline ModelConfig TpMixed(std::uint32_t window = 0, std::uint32_t bits = 0) {
  ModelConfig c;
  c.name = "tp-mixed";
  c.vocab = 258;
  c.hidden = 32;
  c.mlp_hidden = 48;
  c.layers = {LayerType::kKda, LayerType::kMla, LayerType::kAttn, LayerType::kKda, LayerType::kMla};
  c.mla = {4, 16, 4, 8, 8, 10000.0f, IndexerConfig{2, 8, 4, 2}};
  c.kda = {4, 8, 4, -5.0f};
  c.attn = {8, 4, 16, window, 10000.0f, bits};
  return c;
}

// The model at TP `tp` on the CPU backend, two sessions of 128 tokens, in
// chunks of 16 (null, with a test failure, when it cannot be made).
inline std::unique_ptr<TensorParallelModel> MakeTp(const ModelConfig& c, const Weights& w, std::uint32_t tp) {
  TpModelOptions o;
  o.tp = tp;
  o.reserve.max_ctx = 128;
  o.reserve.sessions = 2;
  o.reserve.snapshot_slots = 1;
  o.model.chunk_tokens = 16;
  auto m = TensorParallelModel::Create(c, w, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

}  // namespace primecache::model::testing
