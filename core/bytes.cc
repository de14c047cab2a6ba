#include "core/bytes.h"

#include <cstdio>

#include "primecache/checksum.h"

namespace primecache {

std::string Hex64(std::uint64_t v) {
  return "0x" + HexDigits(v);
}

std::string Quote(std::string_view text) {
  constexpr std::size_t kMax = 64;
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < kMax; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > kMax) out += "...";
  out += "'";
  return out;
}

Status ByteReader::Truncated(std::uint64_t need, std::string_view field) const {
  return Status::Corruption("truncated: " + std::string(field) + " at offset " + std::to_string(offset()) +
                            " needs " + std::to_string(need) + " bytes, " + std::to_string(remaining()) +
                            " left");
}

Status ByteReader::Get(void* v, std::size_t n, std::string_view field) {
  if (remaining() < n) return Truncated(n, field);
  std::memcpy(v, data_.data() + pos_, n);
  pos_ += n;
  return Status::Ok();
}

Status ByteReader::Bytes(std::uint64_t n, std::span<const std::byte>* out, std::string_view field) {
  if (remaining() < n) return Truncated(n, field);
  *out = data_.subspan(pos_, static_cast<std::size_t>(n));
  pos_ += static_cast<std::size_t>(n);
  return Status::Ok();
}

Status ByteReader::StrBody(std::uint64_t len, std::string* out, std::uint64_t max, std::string_view field) {
  if (len > max) {
    return Status::Corruption(std::string(field) + " at offset " + std::to_string(offset()) + " is " +
                              std::to_string(len) + " bytes; at most " + std::to_string(max) + " allowed");
  }
  std::span<const std::byte> b;
  PC_RETURN_IF_ERROR(Bytes(len, &b, field));
  out->assign(reinterpret_cast<const char*>(b.data()), b.size());
  return Status::Ok();
}

Status ByteReader::Str8(std::string* out, std::uint64_t max, std::string_view field) {
  std::uint8_t len = 0;
  PC_RETURN_IF_ERROR(U8(&len, field));
  return StrBody(len, out, max, field);
}

Status ByteReader::Str16(std::string* out, std::uint64_t max, std::string_view field) {
  std::uint16_t len = 0;
  PC_RETURN_IF_ERROR(U16(&len, field));
  return StrBody(len, out, max, field);
}

}  // namespace primecache
