// safetensors reader and writer (f32 tensors only). Layout: an 8-byte
// little-endian header length N, N bytes of JSON header, then the data
// buffer; every tensor's data_offsets are relative to the data buffer.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "primecache/internal/model.h"

namespace primecache::model {
namespace {

using Json = nlohmann::json;

std::uint64_t ReadLe64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

bool MulOverflows(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

// Every refusal names the file.
Status Bad(const std::string& path, const std::string& why) { return Status::InvalidArgument(path + ": " + why); }

// One tensor the header lists: its shape and its bytes [begin, end) of the
// data buffer.
struct Entry {
  std::string name;
  std::vector<std::int64_t> shape;
  std::uint64_t begin, end;
};

// Reads the 8-byte header length and the JSON header it announces, both
// bounded by the limits and the file's size.
Result<std::string> ReadHeader(RandomAccessFile& file, const std::string& path, std::uint64_t file_size,
                               const SafetensorsLimits& lim) {
  char len_buf[8];
  std::size_t got = 0;
  PC_RETURN_IF_ERROR(file.Read(0, std::as_writable_bytes(std::span(len_buf)), &got));
  if (got != 8) return Bad(path, "short read of the header length");
  const std::uint64_t header_len = ReadLe64(len_buf);
  if (header_len > lim.max_header_bytes) {
    return Bad(path, "header length " + std::to_string(header_len) + " exceeds the limit");
  }
  if (header_len > file_size - 8) {
    return Bad(path, "header length " + std::to_string(header_len) + " runs past the end of the file");
  }
  std::string header(header_len, '\0');
  PC_RETURN_IF_ERROR(file.Read(8, std::as_writable_bytes(std::span(header.data(), header.size())), &got));
  if (got != header_len) return Bad(path, "short read of the header");
  return header;
}

// The shape of one tensor's entry: non-negative dimensions, at most max_rank
// of them, whose element count does not overflow; also returns that count.
Result<std::uint64_t> ParseShape(const Json& e, const std::string& path, const std::string& name,
                                 const SafetensorsLimits& lim, std::vector<std::int64_t>* out) {
  auto shape = e.find("shape");
  if (shape == e.end() || !shape->is_array() || shape->size() > lim.max_rank) {
    return Bad(path, "tensor " + name + ": shape missing or of rank above " + std::to_string(lim.max_rank));
  }
  std::uint64_t numel = 1;
  for (const Json& d : *shape) {
    if (!d.is_number_unsigned()) return Bad(path, "tensor " + name + ": shape dimensions must be non-negative integers");
    std::uint64_t dim = d.get<std::uint64_t>();
    if (dim > (1ull << 40) || MulOverflows(numel, dim, &numel)) return Bad(path, "tensor " + name + ": shape overflows");
    out->push_back(static_cast<std::int64_t>(dim));
  }
  return numel;
}

// One tensor's header entry: F32, a bounded shape, and data_offsets that span
// exactly its bytes inside the data buffer of data_size bytes.
Result<Entry> ParseEntry(const Json& e, const std::string& path, const std::string& name,
                         const SafetensorsLimits& lim, std::uint64_t data_size) {
  if (!e.is_object()) return Bad(path, "tensor " + name + ": entry is not an object");
  auto dtype = e.find("dtype");
  if (dtype == e.end() || !dtype->is_string()) return Bad(path, "tensor " + name + ": no dtype");
  if (*dtype != "F32") {
    return Bad(path, "tensor " + name + ": dtype " + dtype->get<std::string>() + " is not supported (only F32)");
  }
  Entry en{name, {}, 0, 0};
  PC_ASSIGN_OR_RETURN(const std::uint64_t numel, ParseShape(e, path, name, lim, &en.shape));
  auto offs = e.find("data_offsets");
  if (offs == e.end() || !offs->is_array() || offs->size() != 2 || !(*offs)[0].is_number_unsigned() ||
      !(*offs)[1].is_number_unsigned()) {
    return Bad(path, "tensor " + name + ": data_offsets must be two non-negative integers");
  }
  en.begin = (*offs)[0].get<std::uint64_t>();
  en.end = (*offs)[1].get<std::uint64_t>();
  std::uint64_t bytes = 0;
  if (MulOverflows(numel, 4, &bytes)) return Bad(path, "tensor " + name + ": size overflows");
  if (en.end < en.begin || en.end - en.begin != bytes) {
    return Bad(path, "tensor " + name + ": data_offsets span " + std::to_string(en.end - en.begin) +
                         " bytes, the shape needs " + std::to_string(bytes));
  }
  if (en.end > data_size) return Bad(path, "tensor " + name + ": data runs past the end of the file");
  return en;
}

// Sorts the entries by offset and checks that they tile the data buffer:
// no overlap, no byte that belongs to no tensor.
Status CheckTiling(std::vector<Entry>& entries, const std::string& path, std::uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  std::uint64_t covered = 0;
  for (const Entry& e : entries) {
    if (e.begin < covered) return Bad(path, "tensor " + e.name + " overlaps the tensor before it");
    if (e.begin > covered) return Bad(path, "bytes before tensor " + e.name + " belong to no tensor");
    covered = e.end;
  }
  if (covered != data_size) return Bad(path, "the data buffer has bytes that belong to no tensor");
  return Status::Ok();
}

}  // namespace

Result<Weights> LoadSafetensors(Env* env, const std::string& path, const SafetensorsLimits& lim) {
  PC_ASSIGN_OR_RETURN(std::uint64_t file_size, env->GetFileSize(path));
  if (file_size < 8) return Bad(path, "too short for a safetensors header");
  if (file_size > lim.max_file_bytes) {
    return Bad(path, "file larger than the limit of " + std::to_string(lim.max_file_bytes) + " bytes");
  }
  PC_ASSIGN_OR_RETURN(auto file, env->NewRandomAccessFile(path));
  PC_ASSIGN_OR_RETURN(const std::string header, ReadHeader(*file, path, file_size, lim));
  const std::uint64_t data_start = 8 + header.size();
  const std::uint64_t data_size = file_size - data_start;

  Json j = Json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad(path, "header is not a JSON object");
  if (j.size() > lim.max_tensors + 1) return Bad(path, "header lists too many tensors");
  std::vector<Entry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    PC_ASSIGN_OR_RETURN(Entry en, ParseEntry(it.value(), path, it.key(), lim, data_size));
    entries.push_back(std::move(en));
  }
  PC_RETURN_IF_ERROR(CheckTiling(entries, path, data_size));

  std::map<std::string, Tensor> tensors;
  for (Entry& e : entries) {
    Tensor t;
    t.shape = std::move(e.shape);
    t.data.resize((e.end - e.begin) / 4);
    std::size_t got = 0;
    PC_RETURN_IF_ERROR(file->Read(data_start + e.begin, std::as_writable_bytes(std::span(t.data)), &got));
    if (got != e.end - e.begin) return Bad(path, "short read of tensor " + e.name);
    tensors.emplace(std::move(e.name), std::move(t));
  }
  return Weights(std::move(tensors));
}

Status SaveSafetensors(Env* env, const std::string& path, const Weights& weights) {
  Json header = Json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, t] : weights.tensors()) {
    const std::uint64_t bytes = t.data.size() * 4;
    header[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // keep the data buffer 8-byte aligned
  std::string out(8, '\0');
  std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += h;
  out.reserve(out.size() + offset);
  for (const auto& [name, t] : weights.tensors()) {
    out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size() * 4);
  }
  return WriteFileAtomically(env, path, out);
}

}  // namespace primecache::model
