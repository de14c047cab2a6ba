#include "statestore/node_filter.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace primecache::statestore_internal {

std::uint32_t NodeFilter::Fingerprint(std::uint64_t scope, std::uint64_t level, std::uint64_t node_hash) {
  const std::uint64_t parts[3] = {scope, level, node_hash};
  auto fp = static_cast<std::uint32_t>(XXH3_64bits(parts, sizeof parts));
  return fp == 0 ? 1 : fp;  // 0 marks an empty cell
}

namespace {
// The home cell of a key: its bits mixed again, so that low bits that many
// keys share do not crowd one run.
std::size_t Home(std::uint32_t key, std::size_t mask) {
  return static_cast<std::size_t>((key * 0x9E3779B1u) >> 7) & mask;
}
}  // namespace

std::size_t NodeFilter::Find(std::uint32_t key) const {
  const std::size_t mask = cells_.size() - 1;
  std::size_t i = Home(key, mask);
  while (cells_[i].key != 0 && cells_[i].key != key) i = (i + 1) & mask;
  return i;
}

bool NodeFilter::MayContain(std::uint32_t fp) const {
  return cells_[Find(fp)].key == fp;
}

void NodeFilter::Grow() {
  std::vector<Cell> old(cells_.size() * 2);
  old.swap(cells_);
  for (const Cell& c : old) {
    if (c.key != 0) cells_[Find(c.key)] = c;
  }
}

void NodeFilter::Adjust(std::uint32_t fp, std::int64_t delta) {
  if (delta == 0) return;
  std::size_t i = Find(fp);
  if (cells_[i].key == 0) {
    if (delta < 0) return;  // nothing to take from
    cells_[i] = {fp, static_cast<std::uint32_t>(delta)};
    if (++used_ * 2 > cells_.size()) Grow();
    return;
  }
  std::int64_t now = static_cast<std::int64_t>(cells_[i].count) + delta;
  if (now > 0) {
    cells_[i].count = static_cast<std::uint32_t>(now);
    return;
  }
  // Remove, shifting later cells of the probe run back (no tombstones).
  const std::size_t mask = cells_.size() - 1;
  cells_[i] = Cell{};
  --used_;
  std::size_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (cells_[j].key == 0) break;
    std::size_t home = Home(cells_[j].key, mask);
    // Move cells_[j] into the hole at i unless its home lies in (i, j].
    bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!stays) {
      cells_[i] = cells_[j];
      cells_[j] = Cell{};
      i = j;
    }
  }
}

void NodeFilter::Reset() {
  cells_.assign(1024, Cell{});
  used_ = 0;
}

}  // namespace primecache::statestore_internal
