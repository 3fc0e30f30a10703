// cpp/src/dispatch.cpp: signature -> tuned variant; reasons are built only on a miss.
#include "honed/dispatch.h"

#include <stdexcept>
#include <utility>

namespace honed {

void Dispatcher::add(GraphProfile profile, int variant) {
  if (variant < 0) {
    throw std::invalid_argument("Dispatcher::add: variant " + std::to_string(variant) +
                                " must be >= 0 (negative ids mean 'no variant')");
  }
  std::vector<SizeRule> rules = size_rules(profile);
  const uint64_t h = graph_hash(profile.graph_key);
  by_hash_[h].push_back(Entry{std::move(profile), std::move(rules), variant});
  ++count_;
}

void Dispatcher::clear() {
  by_hash_.clear();
  count_ = 0;
}

template <typename KeyEquals>
int Dispatcher::find(uint64_t hash, const KeyEquals& key_equals,
                     std::span<const int64_t> sizes) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return kNone;
  int result = kNone;
  for (const Entry& e : it->second) {
    if (!key_equals(e.profile.graph_key)) continue;  // a hash collision
    if (sizes_fit(e.rules, sizes)) return e.variant;
    result = kOutsideProfile;
  }
  return result;
}

int Dispatcher::lookup(const SignatureBuilder& call) const {
  return find(
      call.hash(), [&](const std::string& key) { return call.key_equals(key); }, call.sizes());
}

int Dispatcher::lookup(std::string_view graph_key, uint64_t hash,
                       std::span<const int64_t> sizes) const {
  return find(hash, [&](const std::string& key) { return key == graph_key; }, sizes);
}

DispatchResult Dispatcher::lookup(const Signature& sig) const {
  const std::string key = graph_key(sig);
  auto it = by_hash_.find(graph_hash(key));
  std::vector<int64_t> sizes;
  for (const TensorSpec& t : tensor_specs(sig)) {
    sizes.insert(sizes.end(), t.shape.begin(), t.shape.end());
  }
  std::string reasons;
  if (it != by_hash_.end()) {
    for (const Entry& e : it->second) {
      if (e.profile.graph_key != key) continue;
      if (sizes_fit(e.rules, sizes)) return {e.variant, ""};
      reasons += (reasons.empty() ? "" : "; ") + ("variant " + std::to_string(e.variant) + ": " +
                                                  check_sizes(e.profile, sizes).reason);
    }
  }
  if (!reasons.empty()) {
    return {kOutsideProfile,
            "the call is outside every tuned shape profile of its graph (" + reasons + ")"};
  }
  std::string tuned;
  int shown = 0;
  for (const auto& [h, entries] : by_hash_) {
    for (const Entry& e : entries) {
      if (shown == 3) break;
      tuned += (shown++ ? ", " : "") + e.profile.graph_key;
    }
  }
  if (count_ > 3) tuned += ", ...";
  return {kNone, "no tuned graph has the input signature " + key +
                     (tuned.empty() ? " (nothing is tuned yet)" : " (tuned: " + tuned + ")")};
}

InputGuard::InputGuard(GraphProfile profile)
    : profile_(std::move(profile)),
      rules_(size_rules(profile_)),
      hash_(graph_hash(profile_.graph_key)) {}

bool InputGuard::fits(const SignatureBuilder& call) const {
  return call.hash() == hash_ && call.key_equals(profile_.graph_key) &&
         sizes_fit(rules_, call.sizes());
}

bool InputGuard::fits_sizes(std::span<const int64_t> sizes) const {
  return sizes_fit(rules_, sizes);
}

std::string InputGuard::explain(const Signature& sig) const {
  const std::string key = graph_key(sig);
  if (key != profile_.graph_key) return key_difference(profile_.graph_key, key);
  std::vector<int64_t> sizes;
  for (const TensorSpec& t : tensor_specs(sig))
    sizes.insert(sizes.end(), t.shape.begin(), t.shape.end());
  return explain_sizes(sizes);
}

std::string InputGuard::explain_sizes(std::span<const int64_t> sizes) const {
  return check_sizes(profile_, sizes).reason;
}

}  // namespace honed
