// Redis Cluster's key-to-slot map: CRC16 (XMODEM) of the key, or of its hash
// tag (the text between the first "{" and the next "}" when that text is not
// empty), modulo 16384. Keys sharing a tag live in one slot, so a multi-key
// operation on them goes to one node.
#pragma once

#include <cstdint>
#include <string_view>

namespace primecache::remote {

inline constexpr std::uint16_t kClusterSlots = 16384;

std::uint16_t Crc16(std::string_view bytes);
std::uint16_t KeySlot(std::string_view key);

}  // namespace primecache::remote
