// The tensor-parallel helpers of the Python binding: which layers of a TP
// entry one worker reads (rank_parts, primecache/internal/rank_parts.h) and
// the worker's own shards made of what it read (assemble_rank_parts), so
// that a torch engine's workers of any TP size restore an entry of any other.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "primecache/internal/rank_parts.h"
#include "primecache/internal/shard.h"
#include "python/primecache/binding.h"

namespace primecache::python {

void BindTp(py::module_& m) {
  py::class_<RankLayerSource>(m, "RankLayerSource",
                              "The entry layers one model layer of a worker is made of.")
      .def_readonly("entry_layers", &RankLayerSource::entry_layers)
      .def_readonly("first_stored_rank", &RankLayerSource::first_stored_rank)
      .def_readonly("sharded", &RankLayerSource::sharded);
  py::class_<RankPartsPlan> plan(m, "RankPartsPlan", "What one worker of a TP engine reads of a TP entry.");
  plan.def_readonly("stored_ranks", &RankPartsPlan::stored_ranks)
      .def_readonly("tp", &RankPartsPlan::tp)
      .def_readonly("rank", &RankPartsPlan::rank)
      .def_readonly("fetch", &RankPartsPlan::fetch)
      .def_readonly("layers", &RankPartsPlan::layers);
  FieldRepr(plan, {"stored_ranks", "tp", "rank", "fetch"});
  m.def(
      "is_sharded", [](const LayerShape& shape) { return IsSharded(shape); }, py::arg("shape"),
      "Whether layers of this shape split among TP workers (recurrent and KV layers; latent layers are "
      "replicated): what rank_parts takes for each model layer.");
  m.def(
      "head_groups",
      [](std::uint32_t tp, const std::vector<std::uint32_t>& rank_heads) {
        return HeadGroups(tp, rank_heads);
      },
      py::arg("tp"), py::arg("rank_heads"),
      "How many head-group parts TP `tp` workers publish a boundary in, as the C++ engines do: worker r "
      "publishes parts [r*n, (r+1)*n) (n = head_groups / tp), part r*n + j holding the j-th run of its "
      "heads of each sharded layer and part 0 the replicated layers too; `rank_heads` are a worker's head "
      "counts of its sharded layers (KDA heads, kv heads). Workers of any TP size dividing it then read "
      "only their own heads.");
  m.def(
      "rank_parts",
      [](const std::vector<bool>& sharded, std::uint32_t entry_layers, std::uint32_t stored_ranks,
         std::uint32_t tp, std::uint32_t rank) {
        return ValueOrRaise(PlanRankParts(sharded, entry_layers, stored_ranks, tp, rank));
      },
      py::arg("sharded"), py::arg("entry_layers"), py::arg("stored_ranks"), py::arg("tp"), py::arg("rank"),
      "The plan of worker `rank` of TP `tp` for an entry of `entry_layers` layers (LookupHit.layers) in "
      "`stored_ranks` parts (LookupHit.ranks), for a model whose layer m splits among workers when "
      "sharded[m]: "
      "plan.fetch are the entry layers to fetch (only the parts that hold its heads), in order.");
  m.def(
      "assemble_rank_parts",
      [](const RankPartsPlan& p, const py::sequence& fetched, std::uint32_t kv_heads) {
        std::vector<LayerSnapshot> layers;
        for (std::size_t i = 0; i < py::len(fetched); ++i)
          layers.push_back(SnapshotFromPlanes(fetched[i], i));
        auto mine =
            ValueOrRaise(WithoutGil([&] { return AssembleRankParts(p, std::move(layers), kv_heads); }));
        py::list out;
        for (const LayerSnapshot& l : mine) out.append(PlanesFromSnapshot(l));
        return out;
      },
      py::arg("plan"), py::arg("fetched"), py::arg("kv_heads"),
      "The worker's own layers, one (shape, planes) pair per model layer, from the layers plan.fetch named "
      "(FetchedLayers or (shape, planes) pairs, in plan.fetch's order): the replicated layers as stored, "
      "each "
      "sharded layer gathered from its stored parts and cut to the worker's heads; `kv_heads` are the whole "
      "model's kv heads of each KV layer. ValueError for layers that do not fit the plan.");
}

}  // namespace primecache::python
