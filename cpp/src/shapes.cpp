// cpp/src/shapes.cpp: signatures, graph keys, axis inference, profile checks and JSON.
#include "honed/shapes.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace honed {
namespace {

// One multiply-xorshift round per 8 bytes (a few ns for a typical key); the dispatcher compares
// the key itself after the hash, so collisions cost time, never correctness.
uint64_t mix(uint64_t h) {
  h *= 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

void append_int(std::string& out, int64_t v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, res.ptr);
}

// '|' separates leaves in a graph key; inside user text it is written \x7c (a Python repr never
// contains that escape, so the key stays unambiguous).
void append_escaped(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '|') {
      out += "\\x7c";
    } else {
      out += c;
    }
  }
}

void append_tensor_key(std::string& out, std::string_view dtype, std::string_view device,
                       size_t rank) {
  out += '|';
  out += dtype;
  out += ',';
  out += device;
  out += ',';
  append_int(out, static_cast<int64_t>(rank));
}

void append_constant_key(std::string& out, std::string_view repr) {
  out += "|=";
  append_escaped(out, repr);
}

std::string where(int leaf, int axis) {
  std::string out = "input ";
  out += std::to_string(leaf);
  out += " axis ";
  out += std::to_string(axis);
  return out;
}

// Built by appends: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string temporaries.
std::string range_text(int64_t lo, int64_t hi) {
  std::string out = "[";
  out += std::to_string(lo);
  out += ", ";
  out += std::to_string(hi);
  out += ']';
  return out;
}

}  // namespace

// ---- Signatures -------------------------------------------------------------------------------

bool is_tensor(const Leaf& leaf) { return std::holds_alternative<TensorSpec>(leaf); }

std::vector<TensorSpec> tensor_specs(const Signature& sig) {
  std::vector<TensorSpec> out;
  for (const Leaf& leaf : sig.leaves) {
    if (const auto* t = std::get_if<TensorSpec>(&leaf)) out.push_back(*t);
  }
  return out;
}

std::string graph_key(const Signature& sig) {
  std::string key = sig.structure;
  for (const Leaf& leaf : sig.leaves) {
    if (const auto* t = std::get_if<TensorSpec>(&leaf)) {
      append_tensor_key(key, t->dtype, t->device, t->shape.size());
    } else {
      append_constant_key(key, std::get<Constant>(leaf).repr);
    }
  }
  return key;
}

namespace {
std::string unescape_bar(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 4, "\\x7c") == 0) {
      out += '|';
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}
}  // namespace

ParsedKey parse_graph_key(std::string_view key) {
  ParsedKey out;
  size_t bar = key.find('|');
  out.structure = std::string(key.substr(0, bar));
  if (out.structure.empty()) throw std::invalid_argument("empty graph key structure");
  while (bar != std::string_view::npos) {
    size_t next = key.find('|', bar + 1);
    std::string_view part = key.substr(bar + 1, next == key.npos ? key.npos : next - bar - 1);
    bar = next;
    KeyLeaf leaf;
    if (!part.empty() && part[0] == '=') {
      leaf.constant = Constant{unescape_bar(part.substr(1))};
      out.leaves.push_back(std::move(leaf));
      continue;
    }
    size_t first = part.find(','), last = part.rfind(',');
    size_t rank = 0;
    auto [end, ec] = last == part.npos
                         ? std::from_chars(part.data(), part.data(), rank)
                         : std::from_chars(part.data() + last + 1, part.data() + part.size(), rank);
    if (first == part.npos || first == last || first == 0 || ec != std::errc() ||
        end != part.data() + part.size()) {
      throw std::invalid_argument("malformed tensor leaf '" + std::string(part) +
                                  "' in graph key " + std::string(key) +
                                  " (expected dtype,device,rank)");
    }
    leaf.dtype = std::string(part.substr(0, first));
    leaf.device = std::string(part.substr(first + 1, last - first - 1));
    leaf.rank = rank;
    out.leaves.push_back(std::move(leaf));
  }
  return out;
}

namespace {

// A parsed leaf in words: "float32 of rank 2 on cpu", or "== 0.5" for a constant.
std::string leaf_words(const KeyLeaf& leaf) {
  if (leaf.constant) return "== " + leaf.constant->repr;
  return leaf.dtype + " of rank " + std::to_string(leaf.rank) + " on " + leaf.device;
}

bool same_leaf(const KeyLeaf& a, const KeyLeaf& b) {
  return a.constant == b.constant && a.dtype == b.dtype && a.device == b.device && a.rank == b.rank;
}

}  // namespace

std::string key_difference(std::string_view want, std::string_view got) {
  if (want == got) return "";
  const ParsedKey w = parse_graph_key(want), g = parse_graph_key(got);
  if (w.structure != g.structure || w.leaves.size() != g.leaves.size()) {
    return "the inputs are structured differently: " + g.structure + " where the graph takes " +
           w.structure;
  }
  int tensor = 0;
  for (size_t i = 0; i < w.leaves.size(); ++i) {
    const KeyLeaf &wl = w.leaves[i], &gl = g.leaves[i];
    if (!same_leaf(wl, gl)) {
      if (wl.constant && gl.constant) {
        return "the non-tensor input at leaf " + std::to_string(i) + " was compiled for " +
               leaf_words(wl) + ", got " + gl.constant->repr;
      }
      if (!wl.constant && !gl.constant) {
        return "tensor input " + std::to_string(tensor) + " is " + leaf_words(gl) +
               ", but the graph was compiled for " + leaf_words(wl);
      }
      return "leaf " + std::to_string(i) + " is " +
             (gl.constant ? "a non-tensor value" : "a tensor") + " where the graph takes " +
             (wl.constant ? "a fixed value " : "a tensor ") + leaf_words(wl);
    }
    if (!wl.constant) ++tensor;
  }
  return "";
}

std::string describe(const Signature& sig) {
  std::string out = sig.structure;
  out += ':';
  const char* sep = " ";
  for (const Leaf& leaf : sig.leaves) {
    out += sep;
    sep = ", ";
    if (const auto* t = std::get_if<TensorSpec>(&leaf)) {
      out += t->dtype;
      out += '[';
      for (size_t i = 0; i < t->shape.size(); ++i) {
        if (i) out += ", ";
        append_int(out, t->shape[i]);
      }
      out += "] ";
      out += t->device;
    } else {
      out += '=';
      out += std::get<Constant>(leaf).repr;
    }
  }
  return out;
}

uint64_t graph_hash(std::string_view key) {
  uint64_t h = mix(0x243F6A8885A308D3ull ^ key.size());
  size_t i = 0;
  for (; i + 8 <= key.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, key.data() + i, 8);
    h = mix(h ^ w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, key.data() + i, key.size() - i);
  return mix(h ^ tail);
}

void SignatureBuilder::reset(bool keep_leaves) {
  keep_leaves_ = keep_leaves;
  need_comma_ = false;
  structure_.clear();
  leaf_part_.clear();
  sizes_.clear();
  leaves_.clear();
}

void SignatureBuilder::item() {
  if (need_comma_) structure_ += ',';
}

void SignatureBuilder::open(char bracket, std::string_view type_name) {
  item();
  append_escaped(structure_, type_name);
  structure_ += bracket;
  need_comma_ = false;
}

void SignatureBuilder::close(char bracket) {
  structure_ += bracket;
  need_comma_ = true;
}

void SignatureBuilder::key(std::string_view text, bool is_str) {
  item();
  if (is_str) {
    structure_ += '\'';
    for (char c : text) {
      if (c == '\\' || c == '\'') structure_ += '\\';
      if (c == '|') {
        structure_ += "\\x7c";
      } else {
        structure_ += c;
      }
    }
    structure_ += '\'';
  } else {
    append_escaped(structure_, text);
  }
  structure_ += ':';
  need_comma_ = false;
}

void SignatureBuilder::tensor(std::string_view dtype, std::string_view device,
                              std::span<const int64_t> shape) {
  item();
  structure_ += '*';
  need_comma_ = true;
  append_tensor_key(leaf_part_, dtype, device, shape.size());
  sizes_.insert(sizes_.end(), shape.begin(), shape.end());
  if (keep_leaves_) {
    leaves_.emplace_back(TensorSpec{std::vector<int64_t>(shape.begin(), shape.end()),
                                    std::string(dtype), std::string(device)});
  }
}

void SignatureBuilder::constant(std::string_view repr) {
  item();
  structure_ += '*';
  need_comma_ = true;
  append_constant_key(leaf_part_, repr);
  if (keep_leaves_) leaves_.emplace_back(Constant{std::string(repr)});
}

uint64_t SignatureBuilder::hash() const {
  const size_t n = structure_.size() + leaf_part_.size();
  char buf[256];
  if (n > sizeof(buf)) return graph_hash(structure_ + leaf_part_);
  std::memcpy(buf, structure_.data(), structure_.size());
  std::memcpy(buf + structure_.size(), leaf_part_.data(), leaf_part_.size());
  return graph_hash(std::string_view(buf, n));
}

bool SignatureBuilder::key_equals(std::string_view key) const {
  return key.size() == structure_.size() + leaf_part_.size() &&
         key.substr(0, structure_.size()) == structure_ &&
         key.substr(structure_.size()) == leaf_part_;
}

Signature SignatureBuilder::signature() const {
  if (!keep_leaves_) {
    throw std::logic_error("SignatureBuilder::signature() needs reset(keep_leaves=true)");
  }
  return Signature{structure_, leaves_};
}

// ---- Axis kinds -------------------------------------------------------------------------------

const char* to_string(AxisKind kind) {
  switch (kind) {
    case AxisKind::kStatic:
      return "static";
    case AxisKind::kBatch:
      return "batch";
    case AxisKind::kDynamic:
      return "dynamic";
  }
  return "static";
}

AxisKind axis_kind_from_string(std::string_view s) {
  if (s == "static") return AxisKind::kStatic;
  if (s == "batch") return AxisKind::kBatch;
  if (s == "dynamic") return AxisKind::kDynamic;
  throw std::invalid_argument("unknown axis kind '" + std::string(s) +
                              "': expected static, batch or dynamic");
}

// ---- Inference --------------------------------------------------------------------------------

namespace {

// Sizes of every (tensor input, axis) across the samples: sizes[leaf][axis][sample].
using SampleSizes = std::vector<std::vector<std::vector<int64_t>>>;

SampleSizes collect_sizes(const std::vector<Signature>& samples) {
  SampleSizes sizes;
  for (const Signature& sample : samples) {
    std::vector<TensorSpec> specs = tensor_specs(sample);
    if (sizes.empty()) {
      for (const TensorSpec& t : specs) sizes.emplace_back(t.shape.size());
    }
    for (size_t leaf = 0; leaf < specs.size(); ++leaf) {
      for (size_t axis = 0; axis < specs[leaf].shape.size(); ++axis) {
        sizes[leaf][axis].push_back(specs[leaf].shape[axis]);
      }
    }
  }
  return sizes;
}

bool all_equal(const std::vector<int64_t>& v) {
  return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<>()) == v.end();
}

// The most frequent size within [lo, hi], ties to the largest; hi when none lies in range.
int64_t most_frequent(const std::vector<int64_t>& sizes, int64_t lo, int64_t hi) {
  std::map<int64_t, int> counts;
  for (int64_t s : sizes) {
    if (s >= lo && s <= hi) ++counts[s];
  }
  int64_t best = hi;
  int best_count = 0;
  for (const auto& [size, count] : counts) {
    if (count >= best_count) {  // ascending sizes: >= keeps the largest of a tie
      best = size;
      best_count = count;
    }
  }
  return best;
}

Axis observed_axis(AxisKind kind, std::string name, const std::vector<int64_t>& sizes) {
  auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
  return Axis{kind, std::move(name), *lo, most_frequent(sizes, *lo, *hi), *hi};
}

void require_in_range(const std::vector<int64_t>& sizes, int64_t lo, int64_t hi, int leaf, int axis,
                      const std::string& what) {
  for (size_t s = 0; s < sizes.size(); ++s) {
    if (sizes[s] < lo || sizes[s] > hi) {
      throw std::invalid_argument("sample " + std::to_string(s) + " has " + where(leaf, axis) +
                                  " = " + std::to_string(sizes[s]) + ", outside the range " +
                                  range_text(lo, hi) + " declared for " + what +
                                  ": widen the declared range or drop that sample");
    }
  }
}

// Validates the overrides against the ranks and samples; returns DynamicDim ranges by name.
std::map<std::string, DynamicDim> validate_overrides(const Overrides& overrides,
                                                     const SampleSizes& sizes) {
  std::map<std::string, DynamicDim> named;
  std::map<std::string, std::pair<int, int>> first_of;  // name -> first (leaf, axis)
  std::optional<BatchDim> batch;
  for (const auto& [where_key, ov] : overrides) {
    auto [leaf, axis] = where_key;
    if (leaf < 0 || leaf >= static_cast<int>(sizes.size())) {
      throw std::invalid_argument("dynamic_shapes names input " + std::to_string(leaf) +
                                  ", but the graph has " + std::to_string(sizes.size()) +
                                  " tensor inputs (numbered from 0): fix the input index");
    }
    const int rank = static_cast<int>(sizes[leaf].size());
    if (axis < 0 || axis >= rank) {
      throw std::invalid_argument("dynamic_shapes names " + where(leaf, axis) + ", but input " +
                                  std::to_string(leaf) + " has rank " + std::to_string(rank) +
                                  ": use an axis in [0, " + std::to_string(rank - 1) + "]");
    }
    const std::vector<int64_t>& seen = sizes[leaf][axis];
    if (const auto* fixed = std::get_if<int64_t>(&ov)) {
      if (*fixed < 0) {
        throw std::invalid_argument("dynamic_shapes fixes " + where(leaf, axis) + " at " +
                                    std::to_string(*fixed) + ": a size must be >= 0");
      }
      require_in_range(seen, *fixed, *fixed, leaf, axis, "it (a fixed size)");
    } else if (const auto* dyn = std::get_if<DynamicDim>(&ov)) {
      const std::string label = "DynamicDim '" + dyn->name + "' on " + where(leaf, axis);
      if (dyn->name.empty() || dyn->name == "batch") {
        throw std::invalid_argument(label + ": give it a name other than '' and 'batch' (use " +
                                    "BatchDim for the batch axis)");
      }
      if (dyn->min < 0 || dyn->min > dyn->max) {
        throw std::invalid_argument(label + " has min " + std::to_string(dyn->min) + " and max " +
                                    std::to_string(dyn->max) + ": need 0 <= min <= max");
      }
      if (dyn->opt && (*dyn->opt < dyn->min || *dyn->opt > dyn->max)) {
        throw std::invalid_argument(label + " has opt " + std::to_string(*dyn->opt) + " outside " +
                                    range_text(dyn->min, dyn->max) +
                                    ": choose opt within [min, max]");
      }
      auto it = named.find(dyn->name);
      if (it == named.end()) {
        named.emplace(dyn->name, *dyn);
        first_of.emplace(dyn->name, where_key);
      } else {
        const DynamicDim& prev = it->second;
        const bool opt_differs = prev.opt && dyn->opt && *prev.opt != *dyn->opt;
        if (prev.min != dyn->min || prev.max != dyn->max || opt_differs) {
          auto [pl, pa] = first_of[dyn->name];
          throw std::invalid_argument(label + " has range " + range_text(dyn->min, dyn->max) +
                                      " but " + where(pl, pa) + " declares the same name with " +
                                      range_text(prev.min, prev.max) +
                                      ": one name is one dim, give both the same range");
        }
        if (!prev.opt && dyn->opt) it->second.opt = dyn->opt;
        auto [pl, pa] = first_of[dyn->name];
        if (sizes[pl][pa] != seen) {
          throw std::invalid_argument(
              label + " and " + where(pl, pa) +
              " share a name but differ in size in the samples: " + "rename one of them");
        }
      }
      require_in_range(seen, dyn->min, dyn->max, leaf, axis, label);
    } else {
      const auto& b = std::get<BatchDim>(ov);
      const std::string label = "BatchDim on " + where(leaf, axis);
      if (b.min < 0 || (b.max && *b.max < b.min)) {
        throw std::invalid_argument(label + " has min " + std::to_string(b.min) + " and max " +
                                    (b.max ? std::to_string(*b.max) : "None") +
                                    ": need 0 <= min <= max");
      }
      if (batch && (batch->min != b.min || batch->max != b.max)) {
        throw std::invalid_argument(label + " has a different range than an earlier BatchDim: " +
                                    "all batch axes are one dim, give them the same min and max");
      }
      batch = b;
      require_in_range(seen, b.min, b.max.value_or(INT64_MAX), leaf, axis, label);
    }
  }
  return named;
}

// The batch size of each sample (empty when no batch axis): see infer_profile in shapes.h.
std::vector<int64_t> batch_sizes(const SampleSizes& sizes, const Overrides& overrides) {
  for (const auto& [key, ov] : overrides) {
    if (std::holds_alternative<BatchDim>(ov)) return sizes[key.first][key.second];
  }
  for (size_t leaf = 0; leaf < sizes.size(); ++leaf) {
    if (sizes[leaf].empty() || overrides.count({static_cast<int>(leaf), 0})) continue;
    if (!all_equal(sizes[leaf][0])) return sizes[leaf][0];
  }
  return {};
}

Axis batch_range(const std::vector<int64_t>& batches, const Overrides& overrides) {
  for (const auto& [key, ov] : overrides) {
    if (const auto* b = std::get_if<BatchDim>(&ov)) {
      const int64_t seen_max = *std::max_element(batches.begin(), batches.end());
      const int64_t hi = b->max.value_or(std::max(seen_max, b->min));
      return Axis{AxisKind::kBatch, "batch", b->min, most_frequent(batches, b->min, hi), hi};
    }
  }
  return observed_axis(AxisKind::kBatch, "batch", batches);
}

}  // namespace

GraphProfile infer_profile(const std::vector<Signature>& samples, const Overrides& overrides) {
  if (samples.empty()) {
    throw std::invalid_argument("infer_profile needs at least one sample: record a call first");
  }
  GraphProfile prof;
  prof.graph_key = graph_key(samples[0]);
  for (size_t s = 1; s < samples.size(); ++s) {
    std::string key = graph_key(samples[s]);
    if (key != prof.graph_key) {
      throw std::invalid_argument("sample " + std::to_string(s) + " belongs to graph " + key +
                                  ", sample 0 to graph " + prof.graph_key +
                                  ": infer one profile per graph key");
    }
  }
  const SampleSizes sizes = collect_sizes(samples);
  const std::map<std::string, DynamicDim> named = validate_overrides(overrides, sizes);
  const std::vector<int64_t> batches = batch_sizes(sizes, overrides);
  const Axis batch = batches.empty() ? Axis{} : batch_range(batches, overrides);

  // Dynamic names by size sequence: declared names first, then dim0, dim1, ...
  std::map<std::vector<int64_t>, std::string> name_of;
  for (const auto& [key, ov] : overrides) {
    if (const auto* d = std::get_if<DynamicDim>(&ov)) {
      name_of.emplace(sizes[key.first][key.second], d->name);
    }
  }
  int next_dim = 0;
  auto fresh_name = [&] {
    std::string n;
    do n = "dim" + std::to_string(next_dim++);
    while (named.count(n));
    return n;
  };

  for (size_t leaf = 0; leaf < sizes.size(); ++leaf) {
    std::vector<Axis>& axes = prof.axes.emplace_back();
    for (size_t axis = 0; axis < sizes[leaf].size(); ++axis) {
      const std::vector<int64_t>& seen = sizes[leaf][axis];
      auto ov = overrides.find({static_cast<int>(leaf), static_cast<int>(axis)});
      if (ov != overrides.end()) {
        if (const auto* fixed = std::get_if<int64_t>(&ov->second)) {
          axes.push_back(Axis{AxisKind::kStatic, "", *fixed, *fixed, *fixed});
        } else if (const auto* d = std::get_if<DynamicDim>(&ov->second)) {
          const DynamicDim& r = named.at(d->name);
          axes.push_back(Axis{AxisKind::kDynamic, r.name, r.min,
                              r.opt.value_or(most_frequent(seen, r.min, r.max)), r.max});
        } else {
          axes.push_back(batch);
        }
      } else if (all_equal(seen)) {
        axes.push_back(Axis{AxisKind::kStatic, "", seen[0], seen[0], seen[0]});
      } else if (seen == batches) {
        axes.push_back(batch);
      } else {
        auto it = name_of.find(seen);
        if (it == name_of.end()) it = name_of.emplace(seen, fresh_name()).first;
        auto declared = named.find(it->second);
        if (declared != named.end()) {
          const DynamicDim& r = declared->second;
          axes.push_back(Axis{AxisKind::kDynamic, r.name, r.min,
                              r.opt.value_or(most_frequent(seen, r.min, r.max)), r.max});
        } else {
          axes.push_back(observed_axis(AxisKind::kDynamic, it->second, seen));
        }
      }
    }
  }

  for (const std::vector<Axis>& axes : prof.axes) {
    auto it = std::find_if(axes.begin(), axes.end(),
                           [](const Axis& a) { return a.kind == AxisKind::kBatch; });
    prof.batch_axes.push_back(it == axes.end() ? -1 : static_cast<int>(it - axes.begin()));
    if (it != axes.end()) {
      prof.min_batch = it->min;
      prof.opt_batch = it->opt;
      prof.max_batch = it->max;
    }
  }
  return prof;
}

// ---- Checks -----------------------------------------------------------------------------------

std::vector<SizeRule> size_rules(const GraphProfile& profile) {
  std::vector<SizeRule> rules;
  std::map<std::string, int32_t> first;
  for (const std::vector<Axis>& axes : profile.axes) {
    for (const Axis& a : axes) {
      SizeRule r{a.min, a.max, -1};
      if (a.kind != AxisKind::kStatic) {
        auto [it, inserted] = first.emplace(a.name, static_cast<int32_t>(rules.size()));
        if (!inserted) r.same_as = it->second;
      }
      rules.push_back(r);
    }
  }
  return rules;
}

bool sizes_fit(std::span<const SizeRule> rules, std::span<const int64_t> sizes) {
  if (rules.size() != sizes.size()) return false;
  for (size_t i = 0; i < rules.size(); ++i) {
    const int64_t v = sizes[i];
    if (v < rules[i].min || v > rules[i].max) return false;
    if (rules[i].same_as >= 0 && sizes[rules[i].same_as] != v) return false;
  }
  return true;
}

ShapeCheck check_sizes(const GraphProfile& profile, std::span<const int64_t> sizes) {
  const std::vector<SizeRule> rules = size_rules(profile);
  if (rules.size() != sizes.size()) {
    return {false, "the call has " + std::to_string(sizes.size()) + " tensor axes, the tuned " +
                       "graph " + std::to_string(rules.size())};
  }
  std::vector<std::pair<int, int>> where_of;  // flat index -> (leaf, axis)
  for (size_t leaf = 0; leaf < profile.axes.size(); ++leaf) {
    for (size_t axis = 0; axis < profile.axes[leaf].size(); ++axis) {
      where_of.emplace_back(static_cast<int>(leaf), static_cast<int>(axis));
    }
  }
  std::string reason;
  for (size_t i = 0; i < rules.size(); ++i) {
    auto [leaf, axis] = where_of[i];
    const Axis& a = profile.axes[leaf][axis];
    const std::string at = where(leaf, axis);
    const std::string v = std::to_string(sizes[i]);
    std::string problem;
    if (a.kind == AxisKind::kStatic && sizes[i] != a.min) {
      problem = at + " is " + v + ", the tuned graph fixes it at " + std::to_string(a.min);
    } else if (sizes[i] < a.min || sizes[i] > a.max) {
      problem = at + " (" + a.name + ") is " + v + ", outside the tuned range " +
                range_text(a.min, a.max);
    } else if (rules[i].same_as >= 0 && sizes[rules[i].same_as] != sizes[i]) {
      auto [ol, oa] = where_of[rules[i].same_as];
      problem = at + " (" + a.name + ") is " + v + " but " + where(ol, oa) + " is " +
                std::to_string(sizes[rules[i].same_as]) + ": axes named '" + a.name +
                "' must be equal";
    }
    if (!problem.empty()) reason += (reason.empty() ? "" : "; ") + problem;
  }
  return {reason.empty(), reason};
}

ShapeCheck check(const GraphProfile& profile, const Signature& sig) {
  const std::string key = graph_key(sig);
  if (key != profile.graph_key) {
    return {false, "the input signature " + key + " is not the tuned graph " + profile.graph_key +
                       ": " + key_difference(profile.graph_key, key)};
  }
  std::vector<int64_t> sizes;
  for (const TensorSpec& t : tensor_specs(sig)) {
    sizes.insert(sizes.end(), t.shape.begin(), t.shape.end());
  }
  return check_sizes(profile, sizes);
}

// ---- Helpers ----------------------------------------------------------------------------------

bool has_dynamic(const GraphProfile& profile) {
  for (const std::vector<Axis>& axes : profile.axes) {
    for (const Axis& a : axes) {
      if (a.kind != AxisKind::kStatic) return true;
    }
  }
  return false;
}

namespace {
std::vector<std::vector<int64_t>> shapes_of(const GraphProfile& profile, int64_t Axis::* field) {
  std::vector<std::vector<int64_t>> out;
  for (const std::vector<Axis>& axes : profile.axes) {
    std::vector<int64_t>& shape = out.emplace_back();
    for (const Axis& a : axes) shape.push_back(a.*field);
  }
  return out;
}
}  // namespace

std::vector<std::vector<int64_t>> min_shapes(const GraphProfile& p) {
  return shapes_of(p, &Axis::min);
}
std::vector<std::vector<int64_t>> opt_shapes(const GraphProfile& p) {
  return shapes_of(p, &Axis::opt);
}
std::vector<std::vector<int64_t>> max_shapes(const GraphProfile& p) {
  return shapes_of(p, &Axis::max);
}

std::vector<int64_t> batch_indices(int64_t current_batch, int64_t target_batch) {
  if (current_batch < 1 || target_batch < 0) {
    throw std::invalid_argument("batch_indices(" + std::to_string(current_batch) + ", " +
                                std::to_string(target_batch) +
                                "): need current >= 1 and target >= 0");
  }
  std::vector<int64_t> idx(static_cast<size_t>(target_batch));
  for (int64_t i = 0; i < target_batch; ++i) idx[i] = i % current_batch;
  return idx;
}

// ---- JSON -------------------------------------------------------------------------------------

std::string to_json(const GraphProfile& profile) {
  nlohmann::json axes = nlohmann::json::array();
  for (const std::vector<Axis>& leaf : profile.axes) {
    nlohmann::json row = nlohmann::json::array();
    for (const Axis& a : leaf) {
      row.push_back({{"kind", to_string(a.kind)},
                     {"name", a.name},
                     {"min", a.min},
                     {"opt", a.opt},
                     {"max", a.max}});
    }
    axes.push_back(std::move(row));
  }
  nlohmann::json j = {{"graph_key", profile.graph_key},   {"axes", axes},
                      {"batch_axes", profile.batch_axes}, {"min_batch", profile.min_batch},
                      {"opt_batch", profile.opt_batch},   {"max_batch", profile.max_batch}};
  return j.dump();
}

GraphProfile profile_from_json(std::string_view text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    GraphProfile p;
    p.graph_key = j.at("graph_key").get<std::string>();
    for (const nlohmann::json& row : j.at("axes")) {
      std::vector<Axis>& axes = p.axes.emplace_back();
      for (const nlohmann::json& a : row) {
        axes.push_back(Axis{axis_kind_from_string(a.at("kind").get<std::string>()),
                            a.at("name").get<std::string>(), a.at("min").get<int64_t>(),
                            a.at("opt").get<int64_t>(), a.at("max").get<int64_t>()});
      }
    }
    p.batch_axes = j.at("batch_axes").get<std::vector<int>>();
    p.min_batch = j.at("min_batch").get<int64_t>();
    p.opt_batch = j.at("opt_batch").get<int64_t>();
    p.max_batch = j.at("max_batch").get<int64_t>();
    if (p.batch_axes.size() != p.axes.size()) {
      throw std::invalid_argument("batch_axes has " + std::to_string(p.batch_axes.size()) +
                                  " entries for " + std::to_string(p.axes.size()) + " inputs");
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("bad shape profile JSON: ") + e.what());
  }
}

}  // namespace honed
