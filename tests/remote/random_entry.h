// RandomEntry: an entry for the cluster tests, made of seeded random tokens
// and chunks (two layers of two chunks), so that a test can put many
// distinct entries and check every byte it reads back.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "primecache/checksum.h"
#include "primecache/internal/statestore.h"

namespace primecache::remote::testing {

struct RandomEntry {
  PublishRequest request;
  std::vector<LayerBytes> layers;
};

// What varies between the tests' entries.
struct RandomEntrySpec {
  Hash128 model;
  std::string model_name;
  std::uint32_t seed = 0;       // the entry's own: no two entries share one
  std::size_t tokens = 100;     // random tokens below 50000: no entry's tokens prefix another's
  std::size_t min_chunk = 1024;  // chunk sizes are uniform in [min_chunk, max_chunk]
  std::size_t max_chunk = 1024;
};

inline RandomEntry MakeRandomEntry(const RandomEntrySpec& spec, std::uint32_t i) {
  RandomEntry e;
  e.request.model = spec.model;
  e.request.model_name = spec.model_name;
  e.request.ns = "ns";
  std::mt19937 rng(spec.seed);
  e.request.tokens.resize(spec.tokens);
  for (auto& t : e.request.tokens) t = rng() % 50000;
  e.layers.resize(2);
  for (std::size_t l = 0; l < e.layers.size(); ++l) {
    e.layers[l].header = "header " + std::to_string(i) + "/" + std::to_string(l);
    for (int c = 0; c < 2; ++c) {
      std::string chunk(spec.min_chunk + rng() % (spec.max_chunk - spec.min_chunk + 1), '\0');
      for (char& b : chunk) b = static_cast<char>(rng());
      e.layers[l].chunks.push_back(std::move(chunk));
    }
  }
  return e;
}

}  // namespace primecache::remote::testing
