// Test helpers: a CPU engine and model for a configuration.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "engine/model/hybrid_model.h"

namespace primecache::model::testing {

struct CpuModel {
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<HybridModel> model;
};

inline Result<CpuModel> MakeCpuModel(const ModelConfig& c, const Weights& w, std::uint64_t max_ctx = 256,
                                     std::size_t chunk = 64, std::uint32_t sessions = 2,
                                     std::uint64_t ring_rows = 0, std::uint32_t round_tokens = 0) {
  engine::ReserveRequest req;
  req.plan = HybridModel::PlanFor(c, w);
  req.max_ctx = max_ctx;
  req.sessions = sessions;
  req.snapshot_slots = 1;
  req.index_ring_rows = ring_rows;
  req.round_tokens = round_tokens;
  CpuModel m;
  PC_ASSIGN_OR_RETURN(m.engine, engine::Engine::Create(engine::NewCpuDevice(), req));
  PC_ASSIGN_OR_RETURN(m.model, HybridModel::Create(c, w, m.engine.get(), {chunk}));
  return m;
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

}  // namespace primecache::model::testing
