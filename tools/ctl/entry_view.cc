// The pieces of `ls` and `show` that the local store's entries and the
// remote tier's share (tools/ctl/entry_view.h).
#include "tools/ctl/entry_view.h"

#include <algorithm>
#include <variant>

#include "primecache/internal/codec.h"
#include "primecache/internal/snapshot.h"
#include "tools/ctl/output.h"

namespace primecache::ctl {

namespace {

nlohmann::json GeometryJson(const LayerShape& shape) {
  if (const auto* l = std::get_if<LatentShape>(&shape)) {
    return {{"len", l->len},
            {"width", l->width},
            {"index_width", l->index_width},
            {"pool", l->pool},
            {"pools_ready", l->pools_ready},
            {"index_is_ring", l->index_is_ring},
            {"index_ring_rows", l->index_ring_rows},
            {"dtype", ElementTypeName(l->dtype)},
            {"index_dtype", ElementTypeName(l->index_dtype)}};
  }
  if (const auto* r = std::get_if<RecurrentShape>(&shape)) {
    return {{"heads", r->heads},
            {"head_dim", r->head_dim},
            {"kernel", r->kernel},
            {"conv_dtype", ElementTypeName(r->conv_dtype)},
            {"state_dtype", ElementTypeName(r->state_dtype)}};
  }
  if (const auto* ls = std::get_if<LinearStateShape>(&shape)) {
    return {{"conv_channels", ls->conv_channels},
            {"conv_width", ls->conv_width},
            {"state_heads", ls->state_heads},
            {"state_k_dim", ls->state_k_dim},
            {"state_v_dim", ls->state_v_dim},
            {"conv_dtype", ElementTypeName(ls->conv_dtype)},
            {"state_dtype", ElementTypeName(ls->state_dtype)}};
  }
  const auto& kv = std::get<KvShape>(shape);
  nlohmann::json j = {{"len", kv.len},
                      {"k_width", kv.k_width},
                      {"v_width", kv.v_width},
                      {"dtype", ElementTypeName(kv.dtype)}};
  if (kv.format.indexed()) {
    j["index_width"] = kv.format.index_width;
    j["index_dtype"] = ElementTypeName(kv.index_dtype);
  }
  if (kv.format.rotating()) {
    j["window"] = kv.format.window;
    j["rows"] = kv.rows;
  }
  if (kv.format.quantized()) {
    j["turboquant_bits"] = kv.format.quant_bits;
    j["head_dim"] = kv.format.head_dim;
    j["signs_digest"] = HexDigits(kv.format.signs_digest);
  }
  return j;
}

std::string GeometryText(const LayerShape& shape) {
  if (const auto* l = std::get_if<LatentShape>(&shape)) {
    std::string s = "len " + std::to_string(l->len) + ", width " + std::to_string(l->width);
    if (l->index_width > 0) {
      s += ", index " + std::to_string(l->index_width) + " pool " + std::to_string(l->pool) + " (" +
           std::to_string(l->pools_ready) + " ready, " +
           (l->index_is_ring ? "ring " + std::to_string(l->index_ring_rows) : std::string("flat")) + ")";
    }
    if (l->dtype != ElementType::kF32) s += std::string(", ") + ElementTypeName(l->dtype);
    if (l->index_dtype != ElementType::kF32) s += std::string(", index ") + ElementTypeName(l->index_dtype);
    return s;
  }
  if (const auto* r = std::get_if<RecurrentShape>(&shape)) {
    std::string s = std::to_string(r->heads) + " heads x " + std::to_string(r->head_dim) + ", kernel " +
                    std::to_string(r->kernel);
    if (r->conv_dtype != ElementType::kF32 || r->state_dtype != ElementType::kF32) {
      s += std::string(", conv ") + ElementTypeName(r->conv_dtype) + ", state " +
           ElementTypeName(r->state_dtype);
    }
    return s;
  }
  if (const auto* ls = std::get_if<LinearStateShape>(&shape)) {
    std::string s = "conv " + std::to_string(ls->conv_channels) + " x " + std::to_string(ls->conv_width) +
                    ", state " + std::to_string(ls->state_heads) + " x " + std::to_string(ls->state_k_dim) +
                    " x " + std::to_string(ls->state_v_dim);
    if (ls->conv_dtype != ElementType::kF32 || ls->state_dtype != ElementType::kF32) {
      s += std::string(", conv ") + ElementTypeName(ls->conv_dtype) + ", state " +
           ElementTypeName(ls->state_dtype);
    }
    return s;
  }
  const auto& kv = std::get<KvShape>(shape);
  std::string s = "len " + std::to_string(kv.len) + ", k " + std::to_string(kv.k_width) + ", v " +
                  std::to_string(kv.v_width);
  if (kv.format.indexed()) {
    s += ", index keys " + std::to_string(kv.format.index_width);
    if (kv.index_dtype != kv.dtype) s += std::string(" ") + ElementTypeName(kv.index_dtype);
  }
  if (kv.format.rotating()) {
    s += ", window " + std::to_string(kv.format.window) + " (" + std::to_string(kv.rows) + " rows held)";
  }
  if (kv.format.quantized()) {
    s += ", turboquant " + std::to_string(kv.format.quant_bits) + "-bit head_dim " +
         std::to_string(kv.format.head_dim);
  }
  if (kv.dtype != ElementType::kF32) s += std::string(", ") + ElementTypeName(kv.dtype);
  return s;
}

}  // namespace

nlohmann::json FingerprintJson(const EntryInfo& e, std::string* problem) {
  if (e.model_descriptor.empty()) return nullptr;
  auto fp = DecodeFingerprint(e.model_descriptor);
  if (!fp.ok()) {
    *problem = fp.status().message();
    return nullptr;
  }
  nlohmann::json versions = nlohmann::json::array();
  for (const auto& v : fp->codec_versions) versions.push_back(v);
  return {{"architecture", fp->architecture},
          {"plan_digest", HexDigits(fp->plan_digest)},
          {"weights_digest", HexDigits(fp->weights_digest)},
          {"codec_versions", versions}};
}

ShownLayer ShowLayer(std::size_t i, const std::string& bytes) {
  const std::string checksum = HexDigits(Checksum64(bytes));
  auto h = ParseLayerHeader(AsBytes(bytes));
  if (!h.ok()) {
    return {{{"index", i}, {"error", h.status().message()}, {"checksum", checksum}},
            {std::to_string(i), "(unreadable header)", h.status().message(), "", "", "", "", checksum},
            "layer " + std::to_string(i) + ": " + h.status().message()};
  }
  std::uint64_t raw = 0, enc = 0, chunks = 0;
  nlohmann::json planes = nlohmann::json::array();
  std::vector<std::string> transforms;
  for (const PlaneRecord& p : h->planes) {
    std::uint64_t pr = 0, pe = 0;
    for (const ChunkRecord& c : p.chunks) {
      pr += c.raw_bytes;
      pe += c.encoded_bytes;
    }
    raw += pr;
    enc += pe;
    chunks += p.chunks.size();
    planes.push_back({{"plane", std::string(PlaneName(p.id))},
                      {"transform", p.transform},
                      {"level", p.level},
                      {"rows", p.rows},
                      {"row_width", p.row_width},
                      {"chunk_rows", p.chunk_rows},
                      {"chunks", p.chunks.size()},
                      {"raw_bytes", pr},
                      {"encoded_bytes", pe}});
    const std::string t = p.transform + (p.level != 0 ? ":" + std::to_string(p.level) : "");
    if (std::find(transforms.begin(), transforms.end(), t) == transforms.end()) transforms.push_back(t);
  }
  std::string transform_list;
  for (const auto& t : transforms) transform_list += (transform_list.empty() ? "" : ",") + t;
  return {{{"index", i},
           {"kind", h->kind},
           {"geometry", GeometryJson(h->shape)},
           {"planes", planes},
           {"chunks", chunks},
           {"raw_bytes", raw},
           {"encoded_bytes", enc},
           {"checksum", checksum}},
          {std::to_string(i), h->kind, GeometryText(h->shape), transform_list, std::to_string(chunks),
           HumanBytes(raw), HumanBytes(enc), checksum},
          ""};
}

std::vector<std::string> ShownLayerColumns() {
  return {">LAYER", "KIND", "GEOMETRY", "TRANSFORM", ">CHUNKS", ">RAW", ">ENCODED", "HEADER XXH3"};
}

// A tensor-parallel entry's layers' parts (EntryLayerParts), none for an
// entry of one publisher; a header that does not parse, or layers that are
// not a TP entry's, are noted in *problems and leave every part unset.
std::vector<std::optional<EntryLayerPart>> LayerParts(const EntryInfo& e,
                                                      const std::vector<std::string>& headers,
                                                      std::vector<std::string>* problems) {
  std::vector<std::optional<EntryLayerPart>> parts(headers.size());
  if (e.ranks <= 1) return parts;
  std::vector<LayerShape> shapes;
  for (const std::string& h : headers) {
    auto parsed = ParseLayerHeader(AsBytes(h));
    if (!parsed.ok()) return parts;  // ShowLayer says so
    shapes.push_back(parsed->shape);
  }
  auto found = EntryLayerParts(shapes, e.ranks);
  if (!found.ok()) {
    problems->push_back(found.status().ToString());
    return parts;
  }
  for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = (*found)[i];
  return parts;
}

}  // namespace primecache::ctl
