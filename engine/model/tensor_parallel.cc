#include "engine/model/tensor_parallel.h"

#include <string>
#include <string_view>
#include <thread>

#include "primecache/internal/shard.h"

namespace primecache::model {
namespace {

// How a tensor of the whole model splits: along its first dimension (rows
// of an [out, in] projection), along its second (columns), or not at all,
// into `parts` equal groups (heads, or units of the MLP's inner dimension)
// of which a rank takes its RankHeads.
enum class Cut : std::uint8_t { kWhole, kRows, kColumns };
struct Split {
  Cut cut = Cut::kWhole;
  std::uint32_t parts = 1;
};

// The one table of what splits (the header's list).
Split SplitOf(const ModelConfig& c, std::string_view leaf) {
  const std::uint32_t F = c.mlp_hidden;
  if (leaf == "mlp.w1" || leaf == "mlp.w3") return {Cut::kRows, F};
  if (leaf == "mlp.w2") return {Cut::kColumns, F};
  if (leaf == "mla.wq" || leaf == "mla.wuk" || leaf == "mla.wuv") return {Cut::kRows, c.mla.heads};
  if (leaf == "mla.wo") return {Cut::kColumns, c.mla.heads};
  if (leaf == "kda.wo") return {Cut::kColumns, c.kda.heads};
  if (leaf.starts_with("kda.") && leaf != "kda.o_norm.weight") return {Cut::kRows, c.kda.heads};
  if (leaf == "attn.wq") return {Cut::kRows, c.attn.heads};
  if (leaf == "attn.wk" || leaf == "attn.wv") return {Cut::kRows, c.attn.kv_heads};
  if (leaf == "attn.wo") return {Cut::kColumns, c.attn.heads};
  return {};
}

// "layers.3.mla.wq" -> "mla.wq"; names outside a layer are their own leaf.
std::string_view LeafOf(std::string_view name) {
  if (!name.starts_with("layers.")) return name;
  const std::size_t dot = name.find('.', 7);
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

Result<Tensor> SliceTensor(const std::string& name, const Tensor& t, Split split, std::uint32_t tp,
                           std::uint32_t rank) {
  if (split.cut == Cut::kWhole || tp == 1) return t;
  auto heads = RankHeads(split.parts, tp, rank);
  if (!heads.ok()) return heads.status().WithContext("tensor " + name);
  if (t.shape.empty() || (split.cut == Cut::kColumns && t.shape.size() != 2)) {
    return Status::Internal("tensor " + name + " cannot be split as the TP table says");
  }
  const auto rows = static_cast<std::uint64_t>(t.shape[0]);
  const std::uint64_t inner = t.numel() / rows;
  Tensor out;
  out.shape = t.shape;
  if (split.cut == Cut::kRows) {
    const std::uint64_t per = rows / split.parts, first = heads->first * per * inner;
    out.shape[0] = static_cast<std::int64_t>(heads->count * per);
    out.data.assign(t.data.begin() + static_cast<std::ptrdiff_t>(first),
                    t.data.begin() + static_cast<std::ptrdiff_t>(first + heads->count * per * inner));
    return out;
  }
  const std::uint64_t per = inner / split.parts, first = heads->first * per, width = heads->count * per;
  out.shape[1] = static_cast<std::int64_t>(width);
  out.data.reserve(rows * width);
  for (std::uint64_t r = 0; r < rows; ++r) {
    const auto row = t.data.begin() + static_cast<std::ptrdiff_t>(r * inner + first);
    out.data.insert(out.data.end(), row, row + static_cast<std::ptrdiff_t>(width));
  }
  return out;
}

Status CheckDivides(std::uint32_t tp, std::uint32_t value, const char* what) {
  if (value % tp == 0) return Status::Ok();
  return Status::InvalidArgument("TP " + std::to_string(tp) + " does not divide " + what + " = " +
                                 std::to_string(value));
}

// Every rank picks its greedy tokens from its own logits, which the sums
// make bit-identical: a rank that picked others is a bug, not a tie.
Status SameTokensOnEveryRank(const std::vector<std::vector<std::uint32_t>>& out) {
  for (std::size_t r = 1; r < out.size(); ++r) {
    if (out[r] != out[0]) {
      return Status::Internal("TP rank " + std::to_string(r) + " generated other tokens than rank 0");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> RankConfig(const ModelConfig& whole, std::uint32_t tp) {
  if (tp == 0) return Status::InvalidArgument("TP size 0");
  ModelConfig c = whole;
  PC_RETURN_IF_ERROR(CheckDivides(tp, whole.mlp_hidden, "mlp_hidden"));
  c.mlp_hidden /= tp;
  if (whole.HasLayer(LayerType::kMla)) {
    PC_RETURN_IF_ERROR(CheckDivides(tp, whole.mla.heads, "mla.heads"));
    c.mla.heads /= tp;
  }
  if (whole.HasLayer(LayerType::kKda)) {
    PC_RETURN_IF_ERROR(CheckDivides(tp, whole.kda.heads, "kda.heads"));
    c.kda.heads /= tp;
  }
  if (whole.HasLayer(LayerType::kAttn)) {
    PC_RETURN_IF_ERROR(CheckDivides(tp, whole.attn.heads, "attn.heads"));
    PC_RETURN_IF_ERROR(CheckDivides(tp, whole.attn.kv_heads, "attn.kv_heads"));
    c.attn.heads /= tp;
    c.attn.kv_heads /= tp;
  }
  return c;
}

Result<Weights> RankWeights(const ModelConfig& whole, const Weights& weights, std::uint32_t tp,
                            std::uint32_t rank) {
  PC_RETURN_IF_ERROR(RankConfig(whole, tp).status());
  PC_RETURN_IF_ERROR(weights.CheckAgainst(whole));
  if (rank >= tp)
    return Status::InvalidArgument("rank " + std::to_string(rank) + " of TP " + std::to_string(tp));
  std::map<std::string, Tensor> mine;
  for (const auto& [name, t] : weights.tensors()) {
    PC_ASSIGN_OR_RETURN(Tensor part, SliceTensor(name, t, SplitOf(whole, LeafOf(name)), tp, rank));
    mine.emplace(name, std::move(part));
  }
  return Weights(std::move(mine));
}

TensorParallelModel::TensorParallelModel(ModelConfig whole, std::unique_ptr<CollectiveGroup> group)
    : whole_(std::move(whole)), group_(std::move(group)) {}

TensorParallelModel::~TensorParallelModel() = default;

Result<std::unique_ptr<TensorParallelModel>> TensorParallelModel::Create(const ModelConfig& whole,
                                                                         const Weights& weights,
                                                                         TpModelOptions options) {
  const std::uint32_t tp = options.tp;
  PC_ASSIGN_OR_RETURN(ModelConfig rank_config, RankConfig(whole, tp));
  const bool cuda = options.backend == engine::DeviceKind::kCuda;
  std::vector<int> ordinals = options.cuda_devices;
  if (cuda && ordinals.empty()) {
    for (std::uint32_t r = 0; r < tp; ++r) ordinals.push_back(static_cast<int>(r));
  }
  if (cuda && ordinals.size() != tp) {
    return Status::InvalidArgument("TP " + std::to_string(tp) + " needs " + std::to_string(tp) +
                                   " CUDA devices, " + std::to_string(ordinals.size()) + " given");
  }
  std::vector<Rank> ranks(tp);
  std::vector<Weights> rank_weights;
  for (std::uint32_t r = 0; r < tp; ++r) {
    PC_ASSIGN_OR_RETURN(Weights w, RankWeights(whole, weights, tp, r));
    std::shared_ptr<engine::Device> device;
    if (cuda) {
      PC_ASSIGN_OR_RETURN(device, engine::NewCudaDevice({.ordinal = ordinals[r]}));
    } else {
      device = engine::NewCpuDevice();
    }
    engine::ReserveRequest req = options.reserve;
    req.plan = HybridModel::PlanFor(rank_config, w);
    auto e = engine::Engine::Create(std::move(device), req);
    if (!e.ok()) return e.status().WithContext("TP rank " + std::to_string(r));
    ranks[r].engine = std::move(e).value();
    rank_weights.push_back(std::move(w));
  }
  std::unique_ptr<CollectiveGroup> group;
  if (tp > 1 && cuda) {
    std::vector<void*> streams;
    for (const Rank& rk : ranks) streams.push_back(rk.engine->device().native_stream(engine::Lane::kCompute));
    PC_ASSIGN_OR_RETURN(group, NewNcclGroup(ordinals, streams));
  } else if (tp > 1) {
    PC_ASSIGN_OR_RETURN(group, NewInProcessGroup(tp));
  }
  for (std::uint32_t r = 0; r < tp; ++r) {
    HybridModelOptions mo = options.model;
    mo.collective = group ? &group->rank(r) : nullptr;  // TP 1: today's path
    auto m = HybridModel::Create(rank_config, rank_weights[r], ranks[r].engine.get(), mo);
    if (!m.ok()) return m.status().WithContext("TP rank " + std::to_string(r));
    ranks[r].model = std::move(m).value();
  }
  std::unique_ptr<TensorParallelModel> out(new TensorParallelModel(whole, std::move(group)));
  out->ranks_ = std::move(ranks);
  return out;
}

Status TensorParallelModel::OnEveryRank(const std::function<Status(std::uint32_t rank)>& fn) {
  if (tp() == 1) return fn(0);
  std::vector<Status> done(tp());
  {
    std::vector<std::jthread> threads;
    for (std::uint32_t r = 0; r < tp(); ++r) {
      threads.emplace_back([&, r] {
        done[r] = fn(r);
        if (!done[r].ok()) group_->rank(r).Abort(done[r].WithContext("rank " + std::to_string(r)));
      });
    }
  }
  group_->Reset();
  // The cause, not the ranks it stopped: an error other than the group's abort first.
  for (const Status& s : done) {
    if (!s.ok() && s.code() != StatusCode::kAborted) return s;
  }
  for (const Status& s : done) {
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Result<TpSession> TensorParallelModel::NewSession() {
  TpSession s;
  for (const Rank& rk : ranks_) {
    PC_ASSIGN_OR_RETURN(ModelSession one, rk.model->NewSession());
    s.ranks.push_back(std::move(one));
  }
  return s;
}

Status TensorParallelModel::Prime(TpSession& s, std::span<const std::uint32_t> tokens, LogitsWanted wanted,
                                  std::vector<float>* logits) {
  if (s.ranks.size() != tp()) return Status::InvalidArgument("TP session of another group");
  // Every rank would compute the same logits; only rank 0 does.
  return OnEveryRank([&](std::uint32_t r) {
    return r == 0 ? ranks_[0].model->Prime(s.ranks[0], tokens, wanted, logits)
                  : ranks_[r].model->Prime(s.ranks[r], tokens, LogitsWanted::kNone, nullptr);
  });
}

Result<std::vector<std::uint32_t>> TensorParallelModel::Generate(TpSession& s,
                                                                 std::span<const float> last_logits,
                                                                 std::size_t max_new,
                                                                 std::vector<float>* logits) {
  if (s.ranks.size() != tp()) return Status::InvalidArgument("TP session of another group");
  std::vector<std::vector<std::uint32_t>> out(tp());
  PC_RETURN_IF_ERROR(OnEveryRank([&](std::uint32_t r) -> Status {
    PC_ASSIGN_OR_RETURN(
        out[r], ranks_[r].model->Generate(s.ranks[r], last_logits, max_new, r == 0 ? logits : nullptr));
    return Status::Ok();
  }));
  PC_RETURN_IF_ERROR(SameTokensOnEveryRank(out));
  return out[0];
}

Result<std::vector<std::uint32_t>> TensorParallelModel::GenerateSpeculative(
    TpSession& s, std::span<const std::uint32_t> context, std::span<const float> last_logits,
    std::size_t max_new, const SpeculateOptions& options, SpeculateStats* stats, std::vector<float>* logits) {
  if (s.ranks.size() != tp()) return Status::InvalidArgument("TP session of another group");
  std::vector<std::vector<std::uint32_t>> out(tp());
  std::vector<SpeculateStats> each(tp());
  PC_RETURN_IF_ERROR(OnEveryRank([&](std::uint32_t r) -> Status {
    PC_ASSIGN_OR_RETURN(
        out[r], model::GenerateSpeculative(*ranks_[r].model, s.ranks[r], context, last_logits, max_new,
                                           options, &each[r], r == 0 ? logits : nullptr));
    return Status::Ok();
  }));
  PC_RETURN_IF_ERROR(SameTokensOnEveryRank(out));
  if (stats != nullptr) *stats = each[0];
  return out[0];
}

Result<std::vector<std::vector<LayerSnapshot>>> TensorParallelModel::CaptureFull(TpSession& s) {
  if (s.ranks.size() != tp()) return Status::InvalidArgument("TP session of another group");
  std::vector<std::vector<LayerSnapshot>> shards(tp());
  PC_RETURN_IF_ERROR(OnEveryRank([&](std::uint32_t r) -> Status {
    PC_ASSIGN_OR_RETURN(shards[r], s.ranks[r].cache->CaptureFull());
    return Status::Ok();
  }));
  return shards;
}

Status TensorParallelModel::Restore(TpSession& s, std::span<const std::vector<LayerSnapshot>> shards,
                                    std::uint64_t len) {
  if (s.ranks.size() != tp() || shards.size() != tp()) {
    return Status::InvalidArgument("TP restore: " + std::to_string(shards.size()) + " shards for TP " +
                                   std::to_string(tp()));
  }
  // Every rank validates before any rank copies a byte.
  PC_RETURN_IF_ERROR(OnEveryRank([&](std::uint32_t r) {
    return s.ranks[r].cache->ValidateRestore(shards[r]).WithContext("TP rank " + std::to_string(r));
  }));
  PC_RETURN_IF_ERROR(OnEveryRank([&](std::uint32_t r) -> Status {
    PC_RETURN_IF_ERROR(s.ranks[r].cache->Restore(shards[r]));
    s.ranks[r].position = len;
    return Status::Ok();
  }));
  return Status::Ok();
}

}  // namespace primecache::model
