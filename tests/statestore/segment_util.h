// Test helpers that reach into a store's segment files behind its back (the
// store closed): where a chunk's bytes are, and overwriting bytes in a file.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "primecache/internal/env.h"
#include "raw_db.h"
#include "statestore/format.h"
#include "statestore/segments.h"

namespace primecache::store_test {

struct ChunkPlace {
  std::string file;  // the segment file
  std::uint64_t segment = 0;
  std::uint64_t offset = 0;  // of the chunk's bytes
  std::uint64_t size = 0;
};

inline ChunkPlace PlaceOfChunk(Env* env, const std::string& store, const Hash128& h) {
  RawDb raw(env, store);
  auto rec = statestore_internal::DecodeChunkRef(raw.Get(statestore_internal::kCfChunkRefs,
                                                         statestore_internal::HashKey(h)));
  EXPECT_TRUE(rec.ok()) << rec.status().ToString();
  if (!rec.ok()) return {};
  EXPECT_TRUE(rec->placed);
  return {store + "/segments/" + statestore_internal::SegmentFileName(rec->segment), rec->segment, rec->offset,
          rec->size};
}

// Replaces bytes of a file at `offset` (through the Env).
inline void OverwriteAt(Env* env, const std::string& file, std::uint64_t offset, const std::string& bytes) {
  auto data = ReadFileToString(env, file);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  ASSERT_LE(offset + bytes.size(), data->size());
  data->replace(offset, bytes.size(), bytes);
  auto f = env->NewWritableFile(file);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append(std::as_bytes(std::span(data->data(), data->size()))).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE((*f)->Close().ok());
}

// Replaces a stored chunk's bytes in its segment (same length).
inline void OverwriteChunk(Env* env, const std::string& store, const Hash128& h, const std::string& bytes) {
  ChunkPlace p = PlaceOfChunk(env, store, h);
  ASSERT_EQ(p.size, bytes.size());
  OverwriteAt(env, p.file, p.offset, bytes);
}

}  // namespace primecache::store_test
