// Test machinery for speculative rounds (round_suite.cc, the round fuzz
// target): feeds every layer of a session inputs that depend only on (seed,
// layer, position), the way the model does, through the round API whenever a
// round is armed. A recurrent layer runs the real KDA scan on the device from
// state() into next_state() and, in a round, stashes the scan inputs before
// the step. Two sessions fed the same positions therefore get the same
// inputs, whatever call shapes and rounds brought them there.
//
// No gtest here: the fuzz target links it too.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/device.h"
#include "primecache/internal/engine.h"

namespace primecache::engine::testing {

// n values of one position, uniform in [-2, 2), from (seed, layer, pos, salt)
// (splitmix64: cheap enough for the fuzz target's many small appends).
inline void AppendTokenValues(std::uint64_t seed, std::size_t layer, std::uint64_t pos, std::uint32_t salt,
                              std::size_t n, std::vector<float>* out) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (std::uint64_t{layer} << 48) ^ (pos << 8) ^ salt;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out->push_back(static_cast<float>(z >> 40) / static_cast<float>(1 << 24) * 4.0f - 2.0f);
  }
}

// Values of positions [pos, pos + count), `n` per position, token-major.
inline std::vector<float> TokenValues(std::uint64_t seed, std::size_t layer, std::uint64_t pos,
                                      std::uint64_t count, std::uint32_t salt, std::size_t n) {
  std::vector<float> v;
  v.reserve(count * n);
  for (std::uint64_t p = pos; p < pos + count; ++p) AppendTokenValues(seed, layer, p, salt, n, &v);
  return v;
}

class RoundFeeder {
 public:
  RoundFeeder(Device* dev, SessionCache* s, std::uint64_t seed) : dev_(dev), s_(s), seed_(seed) {}

  std::uint64_t position() const { return pos_; }
  SessionCache* session() const { return s_; }
  // After a restore of a boundary of `pos` tokens.
  void SetPosition(std::uint64_t pos) { pos_ = pos; }

  Status Arm(std::uint64_t tokens) {
    PC_RETURN_IF_ERROR(s_->ArmRound(tokens));
    base_ = pos_;
    return Status::Ok();
  }
  Status Commit() { return s_->CommitRound(); }
  Status Rollback(std::uint64_t keep) {
    PC_RETURN_IF_ERROR(s_->RollbackRound(keep));
    pos_ = base_ + keep;
    return Status::Ok();
  }

  // One call of `count` tokens into every layer.
  Status Append(std::uint64_t count) {
    for (std::size_t i = 0; i < s_->layer_count(); ++i) {
      Status st;
      if (LatentCacheLayer* l = s_->latent(i)) {
        st = AppendLatent(i, l, count);
      } else if (RecurrentCacheLayer* r = s_->recurrent(i)) {
        st = StepRecurrent(i, r, count);
      } else {
        st = AppendKv(i, s_->kv(i), count);
      }
      if (!st.ok()) return st.WithContext("feeder layer " + std::to_string(i));
    }
    pos_ += count;
    return dev_->Synchronize(Lane::kCompute);
  }

  static constexpr float kGateBound = -5.0f;

 private:
  Result<Memory> Upload(const std::vector<float>& host) {
    PC_ASSIGN_OR_RETURN(Memory m, dev_->Allocate(host.size() * sizeof(float)));
    PC_RETURN_IF_ERROR(dev_->Upload(m.data(), host.data(), host.size() * sizeof(float), Lane::kCompute));
    return m;
  }

  Status AppendLatent(std::size_t i, LatentCacheLayer* l, std::uint64_t count) {
    const LatentPlan& p = l->plan();
    PC_ASSIGN_OR_RETURN(Memory rows, Upload(TokenValues(seed_, i, pos_, count, 2, p.width())));
    if (!p.has_indexer()) {
      PC_RETURN_IF_ERROR(l->Append(rows.at<float>(0), nullptr, count, nullptr));
      return dev_->Synchronize(Lane::kCompute);
    }
    PC_ASSIGN_OR_RETURN(Memory index, Upload(TokenValues(seed_, i, pos_, count, 3, p.index_width())));
    PC_ASSIGN_OR_RETURN(Memory ape,
                        Upload(TokenValues(seed_, i, 0, 1, 1, std::size_t{p.pool} * p.index_head_dim)));
    const IndexerInputs ix{p.pool, ape.at<float>(0)};
    PC_RETURN_IF_ERROR(l->Append(rows.at<float>(0), index.at<float>(0), count, &ix));
    return dev_->Synchronize(Lane::kCompute);
  }

  // q and k of every head l2-normalised, as the model hands them to the scan.
  static void NormaliseQk(std::vector<float>* qkv, std::size_t channels, std::size_t heads, std::size_t d) {
    for (std::size_t t = 0; t < qkv->size() / channels; ++t) {
      for (std::size_t h = 0; h < 2 * heads; ++h) {
        float* x = qkv->data() + t * channels + h * d;
        float ss = 0.0f;
        for (std::size_t j = 0; j < d; ++j) ss += x[j] * x[j];
        const float inv = 1.0f / std::sqrt(ss + 1e-6f);
        for (std::size_t j = 0; j < d; ++j) x[j] *= inv;
      }
    }
  }

  Status StepRecurrent(std::size_t i, RecurrentCacheLayer* r, std::uint64_t count) {
    const RecurrentShape& p = r->plan();
    const std::size_t c = p.conv_channels(), nd = std::size_t{p.heads} * p.head_dim;
    std::vector<float> qkv = TokenValues(seed_, i, pos_, count, 8, c);
    NormaliseQk(&qkv, c, p.heads, p.head_dim);
    PC_ASSIGN_OR_RETURN(Memory raw, Upload(TokenValues(seed_, i, pos_, count, 5, c)));
    PC_ASSIGN_OR_RETURN(Memory dqkv, Upload(qkv));
    PC_ASSIGN_OR_RETURN(Memory g, Upload(TokenValues(seed_, i, pos_, count, 9, nd)));
    PC_ASSIGN_OR_RETURN(Memory b, Upload(TokenValues(seed_, i, pos_, count, 10, p.heads)));
    PC_ASSIGN_OR_RETURN(Memory out, dev_->Allocate(count * nd * sizeof(float)));
    PC_RETURN_IF_ERROR(
        dev_->CopyOnDevice(r->next_state(), r->state(), p.state_values() * sizeof(float), Lane::kCompute));
    kernels::KdaScanArgs a;
    a.q = dqkv.at<float>(0);
    a.k = a.q + nd;
    a.v = a.q + 2 * nd;
    a.g = g.at<float>(0);
    a.b = b.at<float>(0);
    a.state = r->next_state();
    a.out = out.at<float>(0);
    a.heads = p.heads;
    a.head_dim = p.head_dim;
    a.count = count;
    a.gate_lower_bound = kGateBound;
    a.qkv_token_stride = c;
    PC_RETURN_IF_ERROR(dev_->KdaScan(a, Lane::kCompute));
    if (s_->round_armed()) {
      PC_RETURN_IF_ERROR(r->StashScanInputs({a.q, a.g, a.b, kGateBound}, count));
    }
    PC_RETURN_IF_ERROR(r->Step(raw.at<float>(0), count));
    return dev_->Synchronize(Lane::kCompute);
  }

  Status AppendKv(std::size_t i, KvCacheLayer* kv, std::uint64_t count) {
    PC_ASSIGN_OR_RETURN(Memory k, Upload(TokenValues(seed_, i, pos_, count, 6, kv->plan().k_width)));
    PC_ASSIGN_OR_RETURN(Memory v, Upload(TokenValues(seed_, i, pos_, count, 7, kv->plan().v_width)));
    PC_RETURN_IF_ERROR(kv->Append(k.at<float>(0), v.at<float>(0), count));
    return dev_->Synchronize(Lane::kCompute);
  }

  Device* dev_;
  SessionCache* s_;
  std::uint64_t seed_;
  std::uint64_t pos_ = 0;
  std::uint64_t base_ = 0;
};

}  // namespace primecache::engine::testing
