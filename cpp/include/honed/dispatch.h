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

}  // namespace honed
