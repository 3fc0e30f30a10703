// cpp/include/honed/dispatch.h: maps a call's signature to a tuned variant, in well under 1 us.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "honed/shapes.h"

namespace honed {

inline constexpr int kNone = -1;            // no tuned graph has this signature
inline constexpr int kOutsideProfile = -2;  // a tuned graph has it, but a size is out of range

struct DispatchResult {
  int variant = kNone;  // >= 0, kNone or kOutsideProfile
  std::string reason;   // empty on a hit
};

// Entries (profile, variant) keyed by the 64-bit hash of the graph key; the key itself is
// compared too, so a hash collision can never pick a wrong variant. Several profiles may share a
// graph key: the first added whose sizes fit wins. Not safe to add() while another thread looks up.
class Dispatcher {
 public:
  void add(GraphProfile profile, int variant);  // variant >= 0, else std::invalid_argument
  void clear();
  size_t size() const { return count_; }

  // Slow path with reasons (also used for the one-time warning).
  DispatchResult lookup(const Signature& sig) const;
  // Hot path: the builder holds the call's key and sizes (built with keep_leaves=false).
  int lookup(const SignatureBuilder& call) const;
  // Hot path for a front end that already holds the call's graph key and its graph_hash (the C++
  // runtime, whose keys are fixed per graph): no allocation.
  int lookup(std::string_view graph_key, uint64_t hash, std::span<const int64_t> sizes) const;

 private:
  template <typename KeyEquals>
  int find(uint64_t hash, const KeyEquals& key_equals, std::span<const int64_t> sizes) const;

  struct Entry {
    GraphProfile profile;
    std::vector<SizeRule> rules;
    int variant;
  };
  std::unordered_map<uint64_t, std::vector<Entry>> by_hash_;
  size_t count_ = 0;
};

// What one compiled payload accepts: a graph profile, the tuned one or the shapes it was compiled
// for when narrower. Every payload backend and the C++ runtime check calls with it before running
// (compiled code does not check shapes: a size outside its range would read out of bounds). A call
// the dispatcher routed under this very profile was checked already.
class InputGuard {
 public:
  explicit InputGuard(GraphProfile profile);
  const GraphProfile& profile() const { return profile_; }
  // Hot path: the builder holds the call's key and sizes (built with keep_leaves=false).
  bool fits(const SignatureBuilder& call) const;
  // For a caller that knows the key matches (the C++ runtime after dispatch): sizes only.
  bool fits_sizes(std::span<const int64_t> sizes) const;
  // Why a call does not fit, naming the input and axis, dtype or value; "" when it fits.
  std::string explain(const Signature& sig) const;
  std::string explain_sizes(std::span<const int64_t> sizes) const;

 private:
  GraphProfile profile_;
  std::vector<SizeRule> rules_;
  uint64_t hash_;
};

}  // namespace honed
