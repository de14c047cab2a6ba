// Tensor-parallel shards of head-split snapshots (primecache/internal/shard.h).
#include "primecache/internal/shard.h"

#include <algorithm>
#include <string>
#include <utility>

namespace primecache {
namespace {

std::string Where(std::uint32_t tp, std::uint32_t rank) {
  return "rank " + std::to_string(rank) + " of TP " + std::to_string(tp);
}

Status CheckRecurrentPlanes(const RecurrentSnapshot& s, const char* what) {
  PC_RETURN_IF_ERROR(CheckShape(LayerShape{s.shape}));
  if (s.conv_ring.size() != s.shape.conv_values() || s.state.size() != s.shape.state_values()) {
    return Status::InvalidArgument(std::string(what) + ": planes do not hold what the shape says");
  }
  return Status::Ok();
}

Status CheckKvPlanes(const KvSnapshot& s, const char* what) {
  PC_RETURN_IF_ERROR(CheckShape(LayerShape{s.shape}));
  if (s.k_rows.size() != s.shape.k_values() || s.v_rows.size() != s.shape.v_values()) {
    return Status::InvalidArgument(std::string(what) + ": planes do not hold what the shape says");
  }
  return Status::Ok();
}

// Copies the column slice [first, first + width) of every row of `src`
// (rows of src_width values) into rows of `width` values.
void SliceColumns(std::span<const float> src, std::uint64_t rows, std::uint64_t src_width,
                  std::uint64_t first, std::uint64_t width, std::vector<float>& out) {
  out.resize(rows * width);
  for (std::uint64_t r = 0; r < rows; ++r) {
    const float* from = src.data() + r * src_width + first;
    std::copy(from, from + width, out.data() + r * width);
  }
}

// The values of one head's part of a row of `width` values split into
// `heads` heads, once the split and the plane's size are known to be sound.
Result<std::uint64_t> HeadWidth(std::uint64_t rows, std::uint64_t width, std::uint32_t heads) {
  if (heads == 0 || width == 0 || width % heads != 0) {
    return Status::InvalidArgument("head-major plane: width " + std::to_string(width) +
                                   " is not split into " + std::to_string(heads) + " heads");
  }
  if (rows != 0 && width > UINT64_MAX / rows) return Status::InvalidArgument("head-major plane: too large");
  return width / heads;
}

// HeadWidth, and the plane holds rows x width values.
Result<std::uint64_t> PerHead(std::span<const float> plane, std::uint64_t rows, std::uint64_t width,
                              std::uint32_t heads) {
  PC_ASSIGN_OR_RETURN(const std::uint64_t w, HeadWidth(rows, width, heads));
  if (plane.size() != rows * width) {
    return Status::InvalidArgument("head-major plane: " + std::to_string(plane.size()) + " values, not " +
                                   std::to_string(rows) + " x " + std::to_string(width));
  }
  return w;
}

}  // namespace

Result<HeadRange> RankHeads(std::uint32_t heads, std::uint32_t tp, std::uint32_t rank) {
  if (heads == 0 || tp == 0) return Status::InvalidArgument("TP shard: heads and TP size must be at least 1");
  if (rank >= tp) return Status::InvalidArgument("TP shard: " + Where(tp, rank) + " does not exist");
  if (heads % tp != 0) {
    return Status::InvalidArgument("TP shard: TP " + std::to_string(tp) + " does not divide " +
                                   std::to_string(heads) + " heads");
  }
  const std::uint32_t count = heads / tp;
  return HeadRange{rank * count, count};
}

Result<RecurrentShardRanges> RecurrentRanges(const RecurrentShape& whole, std::uint32_t tp,
                                             std::uint32_t rank) {
  PC_RETURN_IF_ERROR(CheckShape(LayerShape{whole}));
  PC_ASSIGN_OR_RETURN(HeadRange h, RankHeads(whole.heads, tp, rank));
  const std::uint64_t d = whole.head_dim;
  const std::uint64_t taps = whole.kernel - 1;
  const std::uint64_t plane = std::uint64_t{whole.heads} * d * taps;  // one of q, k, v
  RecurrentShardRanges out;
  out.state = {h.first * d * d, h.count * d * d};
  for (std::uint64_t p = 0; p < 3; ++p) out.conv[p] = {p * plane + h.first * d * taps, h.count * d * taps};
  return out;
}

Result<RecurrentSnapshot> SliceRecurrent(const RecurrentSnapshot& whole, std::uint32_t tp,
                                         std::uint32_t rank) {
  PC_RETURN_IF_ERROR(CheckRecurrentPlanes(whole, "TP slice of a recurrent layer"));
  PC_ASSIGN_OR_RETURN(RecurrentShardRanges r, RecurrentRanges(whole.shape, tp, rank));
  RecurrentSnapshot shard{whole.shape, {}, {}};
  shard.shape.heads = whole.shape.heads / tp;
  const auto state = std::span(whole.state).subspan(r.state.offset, r.state.count);
  shard.state.assign(state.begin(), state.end());
  shard.conv_ring.reserve(shard.shape.conv_values());
  for (const ValueRange& c : r.conv) {
    const auto part = std::span(whole.conv_ring).subspan(c.offset, c.count);
    shard.conv_ring.insert(shard.conv_ring.end(), part.begin(), part.end());
  }
  return shard;
}

Result<RecurrentSnapshot> GatherRecurrent(std::span<const RecurrentSnapshot> shards) {
  if (shards.empty()) return Status::InvalidArgument("TP gather of a recurrent layer: no shards");
  const RecurrentShape& one = shards.front().shape;
  for (const RecurrentSnapshot& s : shards) {
    PC_RETURN_IF_ERROR(CheckRecurrentPlanes(s, "TP gather of a recurrent layer"));
    if (!(s.shape == one))
      return Status::InvalidArgument("TP gather of a recurrent layer: shards differ in shape");
  }
  const auto tp = static_cast<std::uint32_t>(shards.size());
  RecurrentSnapshot whole{one, {}, {}};
  if (std::uint64_t{one.heads} * tp > UINT32_MAX) return Status::InvalidArgument("TP gather: too many heads");
  whole.shape.heads = one.heads * tp;
  PC_RETURN_IF_ERROR(CheckShape(LayerShape{whole.shape}));
  whole.state.reserve(whole.shape.state_values());
  for (const RecurrentSnapshot& s : shards)
    whole.state.insert(whole.state.end(), s.state.begin(), s.state.end());
  const std::uint64_t part = one.conv_values() / 3;  // one plane of one shard
  whole.conv_ring.reserve(whole.shape.conv_values());
  for (std::uint64_t p = 0; p < 3; ++p) {
    for (const RecurrentSnapshot& s : shards) {
      const auto from = s.conv_ring.begin() + static_cast<std::ptrdiff_t>(p * part);
      whole.conv_ring.insert(whole.conv_ring.end(), from, from + static_cast<std::ptrdiff_t>(part));
    }
  }
  return whole;
}

Result<KvSnapshot> SliceKv(const KvSnapshot& whole, std::uint32_t heads, std::uint32_t tp,
                           std::uint32_t rank) {
  PC_RETURN_IF_ERROR(CheckKvPlanes(whole, "TP slice of a KV layer"));
  if (whole.shape.format.index_width != 0) {
    return Status::InvalidArgument("TP slice of a KV layer: indexed KV layers are not sharded");
  }
  PC_ASSIGN_OR_RETURN(HeadRange h, RankHeads(heads, tp, rank));
  const KvShape& s = whole.shape;
  if (s.k_width % heads != 0 || s.v_width % heads != 0) {
    return Status::InvalidArgument("TP slice of a KV layer: row widths " + std::to_string(s.k_width) + "/" +
                                   std::to_string(s.v_width) + " are not split into " +
                                   std::to_string(heads) + " heads");
  }
  const std::uint64_t k_head = s.k_width / heads;
  const std::uint64_t v_head = s.v_width / heads;
  KvSnapshot shard{s, {}, {}};
  shard.shape.k_width = static_cast<std::uint32_t>(k_head * h.count);
  shard.shape.v_width = static_cast<std::uint32_t>(v_head * h.count);
  SliceColumns(whole.k_rows, s.held_rows(), s.k_width, h.first * k_head, shard.shape.k_width, shard.k_rows);
  SliceColumns(whole.v_rows, s.held_rows(), s.v_width, h.first * v_head, shard.shape.v_width, shard.v_rows);
  return shard;
}

Result<KvSnapshot> GatherKv(std::span<const KvSnapshot> shards) {
  if (shards.empty()) return Status::InvalidArgument("TP gather of a KV layer: no shards");
  const KvShape& one = shards.front().shape;
  for (const KvSnapshot& s : shards) {
    PC_RETURN_IF_ERROR(CheckKvPlanes(s, "TP gather of a KV layer"));
    if (!(s.shape == one)) return Status::InvalidArgument("TP gather of a KV layer: shards differ in shape");
  }
  const std::uint64_t tp = shards.size();
  if (one.k_width * tp > UINT32_MAX || one.v_width * tp > UINT32_MAX) {
    return Status::InvalidArgument("TP gather of a KV layer: rows too wide");
  }
  KvSnapshot whole{one, {}, {}};
  whole.shape.k_width = static_cast<std::uint32_t>(one.k_width * tp);
  whole.shape.v_width = static_cast<std::uint32_t>(one.v_width * tp);
  PC_RETURN_IF_ERROR(CheckShape(LayerShape{whole.shape}));
  const std::uint64_t rows = one.held_rows();
  whole.k_rows.resize(rows * whole.shape.k_width);
  whole.v_rows.resize(rows * whole.shape.v_width);
  for (std::uint64_t r = 0; r < rows; ++r) {
    for (std::uint64_t i = 0; i < tp; ++i) {
      const KvSnapshot& s = shards[i];
      std::copy_n(s.k_rows.data() + r * one.k_width, one.k_width,
                  whole.k_rows.data() + r * whole.shape.k_width + i * one.k_width);
      std::copy_n(s.v_rows.data() + r * one.v_width, one.v_width,
                  whole.v_rows.data() + r * whole.shape.v_width + i * one.v_width);
    }
  }
  return whole;
}

Result<std::vector<float>> ToHeadMajor(std::span<const float> plane, std::uint64_t rows, std::uint64_t width,
                                       std::uint32_t heads) {
  PC_ASSIGN_OR_RETURN(const std::uint64_t w, PerHead(plane, rows, width, heads));
  std::vector<float> out(plane.size());
  for (std::uint64_t h = 0; h < heads; ++h) {
    for (std::uint64_t r = 0; r < rows; ++r) {
      std::copy_n(plane.data() + r * width + h * w, w, out.data() + (h * rows + r) * w);
    }
  }
  return out;
}

Result<std::vector<float>> FromHeadMajor(std::span<const float> plane, std::uint64_t rows,
                                         std::uint64_t width, std::uint32_t heads) {
  PC_ASSIGN_OR_RETURN(const std::uint64_t w, PerHead(plane, rows, width, heads));
  std::vector<float> out(plane.size());
  for (std::uint64_t h = 0; h < heads; ++h) {
    for (std::uint64_t r = 0; r < rows; ++r) {
      std::copy_n(plane.data() + (h * rows + r) * w, w, out.data() + r * width + h * w);
    }
  }
  return out;
}

Result<ValueRange> HeadMajorRange(std::uint64_t rows, std::uint64_t width, std::uint32_t heads,
                                  std::uint32_t tp, std::uint32_t rank) {
  PC_ASSIGN_OR_RETURN(const std::uint64_t w, HeadWidth(rows, width, heads));
  PC_ASSIGN_OR_RETURN(HeadRange h, RankHeads(heads, tp, rank));
  const std::uint64_t per_head = rows * w;
  return ValueRange{h.first * per_head, h.count * per_head};
}

}  // namespace primecache
