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
                                     std::uint64_t ring_rows = 0) {
  engine::ReserveRequest req;
  req.plan = HybridModel::PlanFor(c);
  req.max_ctx = max_ctx;
  req.sessions = sessions;
  req.snapshot_slots = 1;
  req.index_ring_rows = ring_rows;
  CpuModel m;
  PC_ASSIGN_OR_RETURN(m.engine, engine::Engine::Create(engine::NewCpuDevice(), req));
  PC_ASSIGN_OR_RETURN(m.model, HybridModel::Create(c, w, m.engine.get(), {chunk}));
  return m;
}

}  // namespace primecache::model::testing
