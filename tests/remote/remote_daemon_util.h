// What the tests of daemons with a remote tier share: a model whose
// fingerprint matches MakeLayers' entries, entries as the tier takes them,
// and the daemon's counters once they reach a value.
#pragma once

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "primecache/internal/model.h"
#include "primecache/internal/snapshot.h"
#include "tests/ipc/daemon_harness.h"

namespace primecache::testing {

// A model with a real fingerprint, its descriptor sent along, whose plan is
// that of MakeLayers' two-layer entries.
inline ModelId FingerprintedModel() {
  ModelFingerprint fp;
  fp.architecture = "remote-model";
  fp.plan_digest = MakeLayersPlan(2);
  fp.weights_digest = {23, 24};
  fp.codec_versions = {"kda-recurrent/v1", "mla-latent/v1", "raw/v1"};
  return ModelId{fp.Digest(), fp.architecture, EncodeFingerprint(fp), {}};
}

inline std::vector<LayerBytes> AsLayerBytes(const std::vector<LayerData>& layers) {
  std::vector<LayerBytes> out;
  for (const LayerData& l : layers) {
    LayerBytes& b = out.emplace_back();
    b.header.assign(reinterpret_cast<const char*>(l.header.data()), l.header.size());
    for (const auto& c : l.chunks) b.chunks.emplace_back(reinterpret_cast<const char*>(c.data()), c.size());
  }
  return out;
}

inline PublishRequest RequestOf(const ModelId& model, std::span<const std::uint32_t> tokens,
                                std::string ns = "") {
  PublishRequest r;
  r.model = model.digest;
  r.model_name = model.name;
  r.model_descriptor = model.descriptor;
  r.ns = std::move(ns);
  r.tokens.assign(tokens.begin(), tokens.end());
  return r;
}

// The daemon's counters over the wire, waiting (up to 10 s) until `done` holds.
template <typename Pred>
std::optional<DaemonStats> StatWhen(Client& c, Pred done) {
  std::optional<DaemonStats> last;
  for (int i = 0; i < 200; ++i) {
    auto s = c.Stat();
    if (s.ok()) {
      last = *s;
      if (done(*s)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return last;
}

}  // namespace primecache::testing
