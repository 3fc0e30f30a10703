// cpp/tests/test_dispatch.cpp: the dispatcher picks the right variant, or says none and why.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "honed/dispatch.h"

using namespace honed;

namespace {

// f(x, flag=<flag>) with x of the given shape; flag "" leaves it out.
void walk(SignatureBuilder& b, const std::vector<int64_t>& shape, const std::string& flag = "",
          const std::string& dtype = "float32") {
  b.open('(');
  b.open('(');
  b.tensor(dtype, "cpu", shape);
  b.close(')');
  b.open('{');
  if (!flag.empty()) {
    b.key("flag", true);
    b.constant(flag);
  }
  b.close('}');
  b.close(')');
}

Signature call(std::vector<int64_t> shape, const std::string& flag = "",
               const std::string& dtype = "float32") {
  SignatureBuilder b;
  b.reset(true);
  walk(b, shape, flag, dtype);
  return b.signature();
}

// The hot path, as the binding runs it.
int fast(const Dispatcher& d, std::vector<int64_t> shape, const std::string& flag = "",
         const std::string& dtype = "float32") {
  SignatureBuilder b;
  b.reset(false);
  walk(b, shape, flag, dtype);
  return d.lookup(b);
}

GraphProfile batch_profile(int64_t lo, int64_t hi, const std::string& flag = "") {
  Overrides ov{{{0, 0}, BatchDim{lo, hi}}};
  return infer_profile({call({lo, 3}, flag)}, ov);
}

}  // namespace

TEST(Dispatch, HitUnknownAndOutside) {
  Dispatcher d;
  d.add(batch_profile(1, 16), 7);
  EXPECT_EQ(d.size(), 1u);

  DispatchResult r = d.lookup(call({8, 3}));
  EXPECT_EQ(r.variant, 7);
  EXPECT_EQ(r.reason, "");
  EXPECT_EQ(fast(d, {8, 3}), 7);

  r = d.lookup(call({8, 3}, "", "float16"));
  EXPECT_EQ(r.variant, kNone);
  EXPECT_EQ(r.reason,
            "no tuned graph has the input signature ((*),{})|float16,cpu,2 "
            "(tuned: ((*),{})|float32,cpu,2)");
  EXPECT_EQ(fast(d, {8, 3}, "", "float16"), kNone);
  EXPECT_EQ(fast(d, {8, 3, 1}), kNone);

  r = d.lookup(call({64, 3}));
  EXPECT_EQ(r.variant, kOutsideProfile);
  EXPECT_EQ(r.reason,
            "the call is outside every tuned shape profile of its graph (variant 7: input 0 axis 0 "
            "(batch) is 64, outside the tuned range [1, 16])");
  EXPECT_EQ(fast(d, {64, 3}), kOutsideProfile);
  EXPECT_EQ(fast(d, {8, 4}), kOutsideProfile);  // static axis differs
}

TEST(Dispatch, TwoProfilesForOneGraphKey) {
  Dispatcher d;
  d.add(batch_profile(1, 8), 0);
  d.add(batch_profile(9, 64), 1);
  EXPECT_EQ(fast(d, {1, 3}), 0);
  EXPECT_EQ(fast(d, {8, 3}), 0);
  EXPECT_EQ(fast(d, {9, 3}), 1);
  EXPECT_EQ(fast(d, {64, 3}), 1);
  EXPECT_EQ(fast(d, {65, 3}), kOutsideProfile);
  const DispatchResult r = d.lookup(call({65, 3}));
  EXPECT_NE(
      r.reason.find("variant 0: input 0 axis 0 (batch) is 65, outside the tuned range [1, 8]"),
      std::string::npos);
  EXPECT_NE(
      r.reason.find("variant 1: input 0 axis 0 (batch) is 65, outside the tuned range [9, 64]"),
      std::string::npos);
  // Overlapping ranges: the first added wins.
  d.add(batch_profile(1, 64), 2);
  EXPECT_EQ(fast(d, {4, 3}), 0);
}

TEST(Dispatch, ConstantLeavesSelectDifferentGraphs) {
  Dispatcher d;
  d.add(batch_profile(1, 16, "True"), 3);
  d.add(batch_profile(1, 16, "False"), 4);
  EXPECT_EQ(fast(d, {2, 3}, "True"), 3);
  EXPECT_EQ(fast(d, {2, 3}, "False"), 4);
  EXPECT_EQ(fast(d, {2, 3}, "None"), kNone);
  EXPECT_EQ(fast(d, {2, 3}), kNone);  // no flag at all: another structure
  EXPECT_EQ(d.lookup(call({2, 3}, "False")).variant, 4);
}

TEST(Dispatch, KeyAndHashPathAgreesWithTheBuilderPath) {
  Dispatcher d;
  d.add(batch_profile(1, 8), 0);
  d.add(batch_profile(9, 64), 1);
  d.add(batch_profile(1, 16, "True"), 2);
  const std::string key = graph_key(call({1, 3}));
  const uint64_t h = graph_hash(key);
  for (int64_t rows : {1, 8, 9, 64, 65}) {
    const std::vector<int64_t> sizes{rows, 3};
    EXPECT_EQ(d.lookup(key, h, sizes), fast(d, {rows, 3})) << rows;
  }
  EXPECT_EQ(d.lookup(key, h, std::vector<int64_t>{4, 3}), 0);
  EXPECT_EQ(d.lookup(key, h, std::vector<int64_t>{4, 5}), kOutsideProfile);
  const std::string flagged = graph_key(call({1, 3}, "True"));
  EXPECT_EQ(d.lookup(flagged, graph_hash(flagged), std::vector<int64_t>{4, 3}), 2);
  // Same hash, other key (a collision): never a variant of the other key.
  EXPECT_EQ(d.lookup(flagged, h, std::vector<int64_t>{4, 3}), kNone);
  EXPECT_EQ(d.lookup("((*),{})|float16,cpu,2", h, std::vector<int64_t>{4, 3}), kNone);
}

TEST(Dispatch, AddValidatesAndClearEmpties) {
  Dispatcher d;
  EXPECT_THROW(d.add(batch_profile(1, 4), -1), std::invalid_argument);
  d.add(batch_profile(1, 4), 0);
  d.add(profile_from_json(to_json(batch_profile(1, 4))), 1);
  EXPECT_EQ(d.size(), 2u);
  d.clear();
  EXPECT_EQ(d.size(), 0u);
  EXPECT_EQ(fast(d, {2, 3}), kNone);
  EXPECT_EQ(d.lookup(call({2, 3})).reason,
            "no tuned graph has the input signature ((*),{})|float32,cpu,2 (nothing is tuned yet)");
}

// Not an assertion on speed (machines differ): prints the engine-side cost of one fast lookup,
// walk included, so a regression shows in the test log.
TEST(Dispatch, FastPathCostIsPrinted) {
  Dispatcher d;
  d.add(batch_profile(1, 64), 0);
  SignatureBuilder b;
  const std::vector<int64_t> shape{8, 3};
  constexpr int kCalls = 1'000'000;
  int hits = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) {
    b.reset(false);
    walk(b, shape);
    hits += d.lookup(b) == 0;
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
      kCalls;
  EXPECT_EQ(hits, kCalls);
  std::printf("[dispatch] engine fast path: %.1f ns per call (one tensor)\n", ns);
}

TEST(InputGuard, FitsWhatTheProfileAllowsAndSaysWhyNot) {
  const InputGuard guard(batch_profile(1, 8, "True"));
  SignatureBuilder b;
  auto fits = [&](std::vector<int64_t> shape, const std::string& flag, const std::string& dtype) {
    b.reset(false);
    walk(b, shape, flag, dtype);
    return guard.fits(b);
  };
  EXPECT_TRUE(fits({1, 3}, "True", "float32"));
  EXPECT_TRUE(fits({8, 3}, "True", "float32"));
  EXPECT_FALSE(fits({9, 3}, "True", "float32"));
  EXPECT_FALSE(fits({4, 4}, "True", "float32"));
  EXPECT_FALSE(fits({4, 3}, "False", "float32"));
  EXPECT_FALSE(fits({4, 3}, "True", "float16"));
  EXPECT_FALSE(fits({4, 3}, "", "float32"));

  EXPECT_EQ(guard.explain(call({4, 3}, "True")), "");
  EXPECT_EQ(guard.explain(call({9, 3}, "True")),
            "input 0 axis 0 (batch) is 9, outside the tuned range [1, 8]");
  EXPECT_EQ(guard.explain(call({4, 3}, "False")),
            "the non-tensor input at leaf 1 was compiled for == True, got False");
  EXPECT_EQ(guard.explain(call({4, 3}, "True", "float16")),
            "tensor input 0 is float16 of rank 2 on cpu, but the graph was compiled for float32 "
            "of rank 2 on cpu");
  EXPECT_EQ(guard.explain(call({4, 3})),
            "the inputs are structured differently: ((*),{}) where the graph takes "
            "((*),{'flag':*})");
  const std::vector<int64_t> sizes{4, 3}, wide{4, 5};
  EXPECT_TRUE(guard.fits_sizes(sizes));
  EXPECT_FALSE(guard.fits_sizes(wide));
  EXPECT_EQ(guard.explain_sizes(wide), "input 0 axis 1 is 5, the tuned graph fixes it at 3");
}

TEST(Shapes, CheckNamesTheLeafThatDiffers) {
  const ShapeCheck c = check(batch_profile(1, 8), call({4, 3}, "", "float64"));
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.reason,
            "the input signature ((*),{})|float64,cpu,2 is not the tuned graph "
            "((*),{})|float32,cpu,2: tensor input 0 is float64 of rank 2 on cpu, but the graph "
            "was compiled for float32 of rank 2 on cpu");
}
