#include "remote/key_slot.h"

namespace primecache::remote {

std::uint16_t Crc16(std::string_view bytes) {
  // CRC-16/XMODEM (polynomial 0x1021, initial value 0), bitwise: keys are
  // short and this runs once per command.
  std::uint16_t crc = 0;
  for (unsigned char c : bytes) {
    crc ^= static_cast<std::uint16_t>(c << 8);
    for (int bit = 0; bit < 8; ++bit)
      crc = (crc & 0x8000) ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021) : static_cast<std::uint16_t>(crc << 1);
  }
  return crc;
}

std::uint16_t KeySlot(std::string_view key) {
  const std::size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return Crc16(key) % kClusterSlots;
}

}  // namespace primecache::remote
