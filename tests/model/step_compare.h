// One step of a state-forced CUDA-against-CPU comparison (model_gpu_test):
// both backends start the step from the same state (the GPU's, restored into
// the CPU session), run the same tokens, and their logits and full captures
// are compared here. Header-only test machinery; CompareStep is pure host
// code so that its refusals are tested on the CPU (step_compare_test.cc).
//
// The rule. TurboQuant picks the nearest centroid, a discontinuous choice,
// and its inputs come from GEMMs that round differently on the two backends,
// so a code of a row the step itself wrote may legitimately land one level
// apart at a near tie. A step where no code differs is compared at full
// strictness: logits and every plane within 1e-4 relative, codes identical.
// A step where codes of its own rows differ (a flip step) must still have:
// every differing code exactly one level apart, no differing code in a row
// held before the step (those are the restored bytes), the norms and every
// plane of the layers up to the first flipped one within 1e-4, and the
// planes after it and the logits within kFlipSlack (a one-level move of one
// rotated coordinate perturbs later arithmetic far less than that; a wrong
// kernel moves it by O(1)).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "engine/model/hybrid_model.h"
#include "primecache/internal/snapshot.h"

namespace primecache::model::testing {

inline constexpr double kStrict = 1e-4;
inline constexpr double kFlipSlack = 5e-2;

inline double RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

struct StepReport {
  std::vector<std::string> failures;  // empty: the step passes
  bool strict = false;                // no code differed: compared at full strictness
  std::size_t codes = 0;              // TurboQuant codes of the step's own rows
  std::size_t flips = 0;              // of those, how many differ (one level apart)
  double logit_err = 0;
  double plane_err = 0;  // worst plane error of the layers held to kStrict
};

// TurboQuant rows of one plane: held rows [0, rows) of `width` words, the
// step's own rows from `first_new` on. Counts codes and differing codes of
// the step's rows and returns the norms' relative error; a difference in an
// older row or of more than one level is a failure.
inline double CompareTqPlane(const std::vector<float>& got, const std::vector<float>& want, std::size_t width,
                             std::size_t first_new, const KvFormat& f, const std::string& what, StepReport* r) {
  if (got.size() != want.size() || width == 0) {
    r->failures.push_back(what + ": plane sizes differ");
    return INFINITY;
  }
  const std::size_t bits = f.quant_bits, entry = 1 + f.head_dim * bits / 32;
  std::vector<float> norms_g, norms_w;
  for (std::size_t e = 0; e < got.size() / entry; ++e) {
    const bool own = e * entry / width >= first_new;
    norms_g.push_back(got[e * entry]);
    norms_w.push_back(want[e * entry]);
    for (std::size_t i = 0; i < f.head_dim; ++i) {
      const std::size_t word = e * entry + 1 + i * bits / 32, shift = (i * bits) % 32;
      std::uint32_t a, b;
      std::memcpy(&a, &got[word], 4);
      std::memcpy(&b, &want[word], 4);
      const int ca = static_cast<int>((a >> shift) & ((1u << bits) - 1));
      const int cb = static_cast<int>((b >> shift) & ((1u << bits) - 1));
      if (own) ++r->codes;
      if (ca == cb) continue;
      if (!own) {
        r->failures.push_back(what + ": code " + std::to_string(i) + " of entry " + std::to_string(e) +
                              " differs in a row held before the step");
      } else if (std::abs(ca - cb) != 1) {
        r->failures.push_back(what + ": code " + std::to_string(i) + " of entry " + std::to_string(e) + " is " +
                              std::to_string(ca) + " against " + std::to_string(cb) + ", not one level apart");
      }
      ++r->flips;
    }
  }
  return RelErr(norms_g, norms_w);
}

// The f32 planes of one layer, in a fixed order (KV planes only when f32).
inline std::vector<const std::vector<float>*> FloatPlanes(const LayerSnapshot& s) {
  if (const auto* l = std::get_if<LatentSnapshot>(&s)) return {&l->latent_rows, &l->index_tail_rows, &l->pool_keys};
  if (const auto* r = std::get_if<RecurrentSnapshot>(&s)) return {&r->conv_ring, &r->state};
  const auto& kv = std::get<KvSnapshot>(s);
  if (kv.shape.format.quantized()) return {};
  return {&kv.k_rows, &kv.v_rows};
}

// Compares one step: `gpu`/`cpu` are full captures after it, `gl`/`cl` its
// logits, `first_new` the first position the step wrote.
inline StepReport CompareStep(const std::vector<LayerSnapshot>& gpu, const std::vector<LayerSnapshot>& cpu,
                              const std::vector<float>& gl, const std::vector<float>& cl, std::uint64_t first_new) {
  StepReport r;
  if (gpu.size() != cpu.size()) {
    r.failures.push_back("layer counts differ");
    return r;
  }
  // Per layer: the f32 planes' worst error and the TurboQuant norms' error;
  // the first layer where a code of the step's rows differs.
  std::vector<double> err(gpu.size(), 0);
  std::size_t first_flip = gpu.size();
  for (std::size_t l = 0; l < gpu.size(); ++l) {
    const std::string where = "layer " + std::to_string(l);
    if (gpu[l].index() != cpu[l].index() || ShapeOf(gpu[l]) != ShapeOf(cpu[l])) {
      r.failures.push_back(where + ": kind or shape differs");
      return r;
    }
    const auto pg = FloatPlanes(gpu[l]), pc = FloatPlanes(cpu[l]);
    for (std::size_t i = 0; i < pg.size(); ++i) err[l] = std::max(err[l], RelErr(*pg[i], *pc[i]));
    const auto* kg = std::get_if<KvSnapshot>(&gpu[l]);
    if (kg == nullptr || !kg->shape.format.quantized()) continue;
    const auto& kc = std::get<KvSnapshot>(cpu[l]);
    const std::uint64_t held = kg->shape.held_rows();
    const std::size_t own = first_new + held >= kg->shape.len ? static_cast<std::size_t>(first_new + held - kg->shape.len) : 0;
    const std::size_t before = r.flips;
    err[l] = std::max(err[l], CompareTqPlane(kg->k_rows, kc.k_rows, kg->shape.k_width, own, kg->shape.format, where + " K", &r));
    err[l] = std::max(err[l], CompareTqPlane(kg->v_rows, kc.v_rows, kg->shape.v_width, own, kg->shape.format, where + " V", &r));
    if (r.flips > before && first_flip == gpu.size()) first_flip = l;
  }
  r.strict = r.flips == 0;
  r.logit_err = RelErr(gl, cl);
  const double logit_bound = r.strict ? kStrict : kFlipSlack;
  if (!(r.logit_err <= logit_bound)) {
    r.failures.push_back("logits rel err " + std::to_string(r.logit_err) + " > " + std::to_string(logit_bound));
  }
  for (std::size_t l = 0; l < gpu.size(); ++l) {
    const double bound = l <= first_flip ? kStrict : kFlipSlack;
    if (l <= first_flip) r.plane_err = std::max(r.plane_err, err[l]);
    if (!(err[l] <= bound)) {
      r.failures.push_back("layer " + std::to_string(l) + " planes rel err " + std::to_string(err[l]) + " > " +
                           std::to_string(bound));
    }
  }
  return r;
}

struct StepTally {
  std::size_t steps = 0, strict = 0, flip_steps = 0, codes = 0, flips = 0;
  double worst_logits = 0;  // of the strict steps
  double worst_plane = 0;   // of the planes held to kStrict
};

// One step from the leader's state: restores it into a fresh follower
// session (none at position 0), runs the step on both, compares the
// leader's result against the follower's, reports failures, tallies.
inline void ForcedStep(HybridModel& leader, ModelSession& ls, HybridModel& follower, ModelSession& fs,
                       std::span<const std::uint32_t> step, StepTally* t) {
  const std::uint64_t first_new = ls.position;
  if (first_new > 0) {
    auto state = ls.cache->CaptureFull();
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    fs = ModelSession{};  // hands the follower's arena back before taking a fresh one
    auto fresh = follower.NewSession();
    ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
    fs = std::move(fresh).value();
    const Status restored = fs.cache->Restore(std::span<const LayerSnapshot>(*state));
    ASSERT_TRUE(restored.ok()) << restored.ToString();
    fs.position = first_new;
  }
  std::vector<float> gl, cl;
  ASSERT_TRUE(leader.Prime(ls, step, LogitsWanted::kAll, &gl).ok());
  ASSERT_TRUE(follower.Prime(fs, step, LogitsWanted::kAll, &cl).ok());
  auto after_l = ls.cache->CaptureFull();
  auto after_f = fs.cache->CaptureFull();
  ASSERT_TRUE(after_l.ok() && after_f.ok());
  const StepReport r = CompareStep(*after_l, *after_f, gl, cl, first_new);
  for (const std::string& f : r.failures) ADD_FAILURE() << "step at position " << first_new << ": " << f;
  ++t->steps;
  t->codes += r.codes;
  t->flips += r.flips;
  if (r.strict) {
    ++t->strict;
    t->worst_logits = std::max(t->worst_logits, r.logit_err);
  } else {
    ++t->flip_steps;
    std::printf("[ model-gpu ] flip step at position %llu (+%zu tokens): %zu of %zu codes one level apart, "
                "logits rel err %.3g\n",
                static_cast<unsigned long long>(first_new), step.size(), r.flips, r.codes, r.logit_err);
  }
  t->worst_plane = std::max(t->worst_plane, r.plane_err);
}

// The whole prompt, state-forced: calls of one token, every tenth of 13
// (a chunk's multi-token path), each a ForcedStep.
inline void RunStateForced(HybridModel& leader, ModelSession& ls, HybridModel& follower, ModelSession& fs,
                           std::span<const std::uint32_t> tokens, StepTally* t) {
  for (std::size_t at = 0, call = 0; at < tokens.size(); ++call) {
    const std::size_t n = std::min<std::size_t>(call % 10 == 9 ? 13 : 1, tokens.size() - at);
    ASSERT_NO_FATAL_FAILURE(ForcedStep(leader, ls, follower, fs, tokens.subspan(at, n), t));
    at += n;
  }
}

}  // namespace primecache::model::testing
