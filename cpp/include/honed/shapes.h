// cpp/include/honed/shapes.h: input signatures, graph keys, batch/dynamic axis inference, profiles.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace honed {

// ---- Signatures -------------------------------------------------------------------------------

struct TensorSpec {
  std::vector<int64_t> shape;
  std::string dtype;   // "float32", "bfloat16", ...
  std::string device;  // "cpu", "cuda:0", ...
  bool operator==(const TensorSpec&) const = default;
};

// A non-tensor input, kept as its repr ("None", "True", "3", "'relu'", "<Generator>").
struct Constant {
  std::string repr;
  bool operator==(const Constant&) const = default;
};

using Leaf = std::variant<TensorSpec, Constant>;

// One call's inputs: `structure` is the nesting with a `*` per leaf, e.g. "((*,*),{'mask':*})"
// for f(x, y, mask=m); `leaves` are in flatten order.
struct Signature {
  std::string structure;
  std::vector<Leaf> leaves;
  bool operator==(const Signature&) const = default;
};

bool is_tensor(const Leaf& leaf);
std::vector<TensorSpec> tensor_specs(const Signature& sig);  // tensor leaves in flatten order
// Readable one-liner: "((*,*),{}): float32[8, 3] cpu, =True".
std::string describe(const Signature& sig);

// The graph a call belongs to: structure, then per leaf "|dtype,device,rank" (tensor; sizes are
// NOT part of it) or "|=repr" (constant). A '|' inside a constant or dict key is written "\x7c".
std::string graph_key(const Signature& sig);
// graph_key's inverse: the structure, then per leaf a tensor's dtype, device and rank, or a
// constant's repr (unescaped). Throws std::invalid_argument naming the malformed part.
struct KeyLeaf {
  std::optional<Constant> constant;  // set for a constant leaf
  std::string dtype;                 // tensor leaves: "float32"
  std::string device;                // tensor leaves: "cuda:0"
  size_t rank = 0;                   // tensor leaves
};
struct ParsedKey {
  std::string structure;
  std::vector<KeyLeaf> leaves;
};
ParsedKey parse_graph_key(std::string_view key);
// A fast 64-bit hash of the key (word-wise multiply-xorshift). In-process only: never persist it.
uint64_t graph_hash(std::string_view graph_key);
// How the graph key `got` (a call's) differs from `want` (a tuned graph's), in words: the
// structure, or the first leaf whose dtype, device, rank or constant value differs; "" if equal.
std::string key_difference(std::string_view want, std::string_view got);

// Builds a Signature while a front end walks one call's inputs in flatten order, and the graph
// key and sizes on the way. With keep_leaves=false it only keeps the key and the concatenated
// tensor sizes: the dispatch fast path, which allocates nothing once its buffers have grown.
class SignatureBuilder {
 public:
  void reset(bool keep_leaves);
  // bracket: '(' tuple, '[' list, '{' dict. type_name marks a subclass (a namedtuple, ...).
  void open(char bracket, std::string_view type_name = {});
  void close(char bracket);
  // A dict key, before its value. is_str: written quoted ('a'); otherwise text is its repr.
  void key(std::string_view text, bool is_str);
  void tensor(std::string_view dtype, std::string_view device, std::span<const int64_t> shape);
  void constant(std::string_view repr);

  uint64_t hash() const;                              // == graph_hash(graph_key(signature()))
  bool key_equals(std::string_view graph_key) const;  // without concatenating
  std::span<const int64_t> sizes() const { return sizes_; }
  Signature signature() const;  // needs keep_leaves=true

 private:
  void item();
  bool keep_leaves_ = true;
  bool need_comma_ = false;
  std::string structure_;
  std::string leaf_part_;
  std::vector<int64_t> sizes_;
  std::vector<Leaf> leaves_;
};

// ---- Profiles ---------------------------------------------------------------------------------

enum class AxisKind { kStatic, kBatch, kDynamic };
const char* to_string(AxisKind kind);                // "static", "batch", "dynamic"
AxisKind axis_kind_from_string(std::string_view s);  // throws std::invalid_argument

// One axis of one tensor input. Static axes: name "" and min == opt == max == the size.
struct Axis {
  AxisKind kind = AxisKind::kStatic;
  std::string name;
  int64_t min = 0;
  int64_t opt = 0;
  int64_t max = 0;
  bool operator==(const Axis&) const = default;
};

struct GraphProfile {
  std::string graph_key;
  std::vector<std::vector<Axis>> axes;  // per tensor leaf, per axis
  std::vector<int> batch_axes;          // per tensor leaf: its batch axis, -1 for none
  int64_t min_batch = 0;                // 0, 0, 0 when no axis is a batch axis
  int64_t opt_batch = 0;
  int64_t max_batch = 0;
  bool operator==(const GraphProfile&) const = default;
};

// User overrides per (tensor leaf index, axis) (Python: dynamic_shapes=).
struct DynamicDim {
  std::string name;
  int64_t min = 0;
  int64_t max = 0;
  std::optional<int64_t> opt;  // default: the most frequent sample size in range, else max
  bool operator==(const DynamicDim&) const = default;
};
struct BatchDim {
  int64_t min = 1;
  std::optional<int64_t> max;  // default: the largest sample batch (at least min)
  bool operator==(const BatchDim&) const = default;
};
using AxisOverride = std::variant<int64_t, DynamicDim, BatchDim>;  // int64_t: static size
using Overrides = std::map<std::pair<int, int>, AxisOverride>;

// Infers a profile from samples of one graph (throws std::invalid_argument on no samples,
// samples of different graphs, or bad overrides; the message names input, axis and the fix).
// Rules, per tensor input and axis, over the samples:
//  - the batch size of a sample is the size on the first BatchDim override axis if any, else on
//    axis 0 of the first tensor input (flatten order) whose axis 0 varies and is not overridden;
//  - an axis whose size never changes is static (so with ONE sample everything is static);
//  - an axis whose sizes equal the batch sizes in every sample is a batch axis (name "batch");
//  - any other varying axis is dynamic; axes with identical size sequences share one name (an
//    overridden DynamicDim's name when its sizes match one, else "dim0", "dim1", ...);
//  - min/max are the extremes seen; opt is the most frequent size (ties: the largest).
// Overrides win; samples must fit them (a sample outside a declared range is an error).
GraphProfile infer_profile(const std::vector<Signature>& samples, const Overrides& overrides = {});

struct ShapeCheck {
  bool ok = true;
  std::string reason;  // empty when ok
};

// Whether a call fits the profile: same graph key, every size in its range, and axes that share
// a name equal to each other. The reason names the input, axis, size and the allowed range.
ShapeCheck check(const GraphProfile& profile, const Signature& sig);

bool has_dynamic(const GraphProfile& profile);  // any batch or dynamic axis
std::vector<std::vector<int64_t>> min_shapes(const GraphProfile& profile);
std::vector<std::vector<int64_t>> opt_shapes(const GraphProfile& profile);
std::vector<std::vector<int64_t>> max_shapes(const GraphProfile& profile);

std::string to_json(const GraphProfile& profile);
GraphProfile profile_from_json(std::string_view json);  // throws std::invalid_argument

// A profile flattened for the hot path: one rule per tensor axis, in flatten order.
struct SizeRule {
  int64_t min = 0;
  int64_t max = 0;
  int32_t same_as = -1;  // index of the first earlier axis with the same name, or -1
};
std::vector<SizeRule> size_rules(const GraphProfile& profile);
bool sizes_fit(std::span<const SizeRule> rules, std::span<const int64_t> sizes);
// The slow twin of sizes_fit, with the reason (sizes: all tensor sizes, concatenated).
ShapeCheck check_sizes(const GraphProfile& profile, std::span<const int64_t> sizes);

// Rows to run for target_batch given current_batch rows: 0..target-1 when target <= current,
// else i % current (cyclic repeat). Throws std::invalid_argument for current < 1 or target < 0.
std::vector<int64_t> batch_indices(int64_t current_batch, int64_t target_batch);

}  // namespace honed
