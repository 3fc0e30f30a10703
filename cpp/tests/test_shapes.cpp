// cpp/tests/test_shapes.cpp: signatures, graph keys, axis inference, overrides, checks, JSON.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "honed/shapes.h"

using namespace honed;

namespace {

// f(*tensors) on cpu: structure "((*,*,...),{})".
Signature call(const std::vector<std::vector<int64_t>>& shapes,
               const std::string& dtype = "float32", const std::string& device = "cpu") {
  SignatureBuilder b;
  b.reset(true);
  b.open('(');
  b.open('(');
  for (const auto& s : shapes) b.tensor(dtype, device, s);
  b.close(')');
  b.open('{');
  b.close('}');
  b.close(')');
  return b.signature();
}

std::string error_of(const std::vector<Signature>& samples, const Overrides& ov) {
  try {
    infer_profile(samples, ov);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Signature, BuilderWritesNestedStructure) {
  SignatureBuilder b;
  b.reset(true);
  b.open('(');
  b.open('(');
  b.tensor("float32", "cpu", std::vector<int64_t>{2, 3});
  b.open('{');
  b.key("a", true);
  b.constant("None");
  b.key("it's|", true);
  b.open('[');
  b.constant("3");
  b.tensor("int64", "cuda:0", std::vector<int64_t>{5});
  b.close(']');
  b.close('}');
  b.close(')');
  b.open('{');
  b.key("flag", true);
  b.constant("True");
  b.close('}');
  b.close(')');
  Signature s = b.signature();
  EXPECT_EQ(s.structure, R"(((*,{'a':*,'it\'s\x7c':[*,*]}),{'flag':*}))");
  ASSERT_EQ(s.leaves.size(), 5u);
  EXPECT_EQ(std::get<TensorSpec>(s.leaves[0]).shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::get<Constant>(s.leaves[1]).repr, "None");
  EXPECT_EQ(std::get<TensorSpec>(s.leaves[3]).device, "cuda:0");
  EXPECT_EQ(graph_key(s), s.structure + "|float32,cpu,2|=None|=3|int64,cuda:0,1|=True");
  EXPECT_EQ(b.hash(), graph_hash(graph_key(s)));
  EXPECT_TRUE(b.key_equals(graph_key(s)));
  EXPECT_FALSE(b.key_equals(graph_key(s) + "x"));
  EXPECT_EQ(b.sizes().size(), 3u);
  EXPECT_EQ(describe(s), s.structure + ": float32[2, 3] cpu, =None, =3, int64[5] cuda:0, =True");
}

TEST(Signature, FastBuilderKeepsOnlyKeyAndSizes) {
  SignatureBuilder b;
  b.reset(false);
  b.open('(');
  b.tensor("float32", "cpu", std::vector<int64_t>{4, 7});
  b.close(')');
  EXPECT_TRUE(b.key_equals("(*)|float32,cpu,2"));
  EXPECT_EQ(std::vector<int64_t>(b.sizes().begin(), b.sizes().end()), (std::vector<int64_t>{4, 7}));
  EXPECT_THROW(b.signature(), std::logic_error);
}

TEST(GraphKey, SharedAcrossBatchSizesDistinctOtherwise) {
  const std::string k = graph_key(call({{8, 3}}));
  EXPECT_EQ(k, graph_key(call({{1, 3}})));
  EXPECT_EQ(k, graph_key(call({{8, 99}})));
  EXPECT_NE(k, graph_key(call({{8, 3}}, "float16")));
  EXPECT_NE(k, graph_key(call({{8, 3}}, "float32", "cuda:0")));
  EXPECT_NE(k, graph_key(call({{8, 3, 1}})));
  EXPECT_NE(k, graph_key(call({{8, 3}, {8, 3}})));
  Signature with_flag = call({{8, 3}});
  with_flag.leaves.push_back(Constant{"True"});
  Signature without_flag = with_flag;
  std::get<Constant>(without_flag.leaves[1]).repr = "False";
  EXPECT_NE(graph_key(with_flag), graph_key(without_flag));
  // A '|' inside a constant cannot forge a tensor leaf.
  Signature forged = call({{8, 3}});
  forged.leaves.insert(forged.leaves.begin(), Constant{"x|float32,cpu,2"});
  EXPECT_EQ(graph_key(forged).find("x|"), std::string::npos);
}

TEST(GraphKey, ParserInvertsThePrinter) {
  Signature s{"((*,*,*),{'mode':*})",
              {TensorSpec{{8, 3}, "float32", "cuda:0"}, Constant{"'a|b'"},
               TensorSpec{{2}, "int64", "cpu"}, Constant{"None"}}};
  ParsedKey k = parse_graph_key(graph_key(s));
  EXPECT_EQ(k.structure, s.structure);
  ASSERT_EQ(k.leaves.size(), 4u);
  EXPECT_FALSE(k.leaves[0].constant);
  EXPECT_EQ(k.leaves[0].dtype, "float32");
  EXPECT_EQ(k.leaves[0].device, "cuda:0");
  EXPECT_EQ(k.leaves[0].rank, 2u);
  EXPECT_EQ(k.leaves[1].constant->repr, "'a|b'");  // the escaped bar comes back
  EXPECT_EQ(k.leaves[2].rank, 1u);
  EXPECT_EQ(k.leaves[3].constant->repr, "None");
  EXPECT_THROW(parse_graph_key("((*,),{})|float32,cpu"), std::invalid_argument);
  EXPECT_THROW(parse_graph_key("((*,),{})|float32,cpu,two"), std::invalid_argument);
  EXPECT_THROW(parse_graph_key(""), std::invalid_argument);
}

TEST(Infer, OneSampleIsAllStatic) {
  GraphProfile p = infer_profile({call({{4, 3, 224, 224}})});
  ASSERT_EQ(p.axes.size(), 1u);
  for (const Axis& a : p.axes[0]) EXPECT_EQ(a.kind, AxisKind::kStatic);
  EXPECT_EQ(p.axes[0][2], (Axis{AxisKind::kStatic, "", 224, 224, 224}));
  EXPECT_EQ(p.batch_axes, std::vector<int>{-1});
  EXPECT_EQ(p.max_batch, 0);
  EXPECT_FALSE(has_dynamic(p));
}

TEST(Infer, BatchOnSeveralInputsWithSizeOneBatch) {
  // x [B, 3], y [B, 5], z [7, B]; batches 1, 8, 4, 8.
  std::vector<Signature> s;
  for (int64_t b : {1, 8, 4, 8}) s.push_back(call({{b, 3}, {b, 5}, {7, b}}));
  GraphProfile p = infer_profile(s);
  const Axis batch{AxisKind::kBatch, "batch", 1, 8, 8};
  EXPECT_EQ(p.axes[0][0], batch);
  EXPECT_EQ(p.axes[1][0], batch);
  EXPECT_EQ(p.axes[2][1], batch);
  EXPECT_EQ(p.axes[2][0].kind, AxisKind::kStatic);
  EXPECT_EQ(p.batch_axes, (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(p.min_batch, 1);
  EXPECT_EQ(p.opt_batch, 8);
  EXPECT_EQ(p.max_batch, 8);
  EXPECT_TRUE(has_dynamic(p));
}

TEST(Infer, SharedSequenceAxisAndIndependentDim) {
  // ids [B, S], mask [B, S], extra [T]: S is shared by two inputs, T varies on its own.
  std::vector<Signature> s;
  const int64_t rows[][3] = {{2, 10, 5}, {4, 20, 6}, {2, 30, 5}};
  for (const auto& r : rows) s.push_back(call({{r[0], r[1]}, {r[0], r[1]}, {r[2]}}));
  GraphProfile p = infer_profile(s);
  EXPECT_EQ(p.axes[0][0].kind, AxisKind::kBatch);
  EXPECT_EQ(p.axes[1][0].kind, AxisKind::kBatch);
  EXPECT_EQ(p.opt_batch, 2);
  const Axis seq{AxisKind::kDynamic, "dim0", 10, 30, 30};  // all once: tie -> largest
  EXPECT_EQ(p.axes[0][1], seq);
  EXPECT_EQ(p.axes[1][1], seq);
  EXPECT_EQ(p.axes[2][0], (Axis{AxisKind::kDynamic, "dim1", 5, 5, 6}));
  EXPECT_EQ(p.batch_axes, (std::vector<int>{0, 0, -1}));
  EXPECT_EQ(min_shapes(p), (std::vector<std::vector<int64_t>>{{2, 10}, {2, 10}, {5}}));
  EXPECT_EQ(opt_shapes(p), (std::vector<std::vector<int64_t>>{{2, 30}, {2, 30}, {5}}));
  EXPECT_EQ(max_shapes(p), (std::vector<std::vector<int64_t>>{{4, 30}, {4, 30}, {6}}));
}

TEST(Infer, OptIsMostFrequentTiesToLargest) {
  std::vector<Signature> s;
  for (int64_t b : {4, 4, 8, 2}) s.push_back(call({{b}}));
  EXPECT_EQ(infer_profile(s).opt_batch, 4);
  s.clear();
  for (int64_t b : {4, 8, 4, 8, 2}) s.push_back(call({{b}}));
  EXPECT_EQ(infer_profile(s).opt_batch, 8);
}

TEST(Infer, BatchIsFirstInputVaryingOnAxisZero) {
  // Input 0 is constant on axis 0, so input 1 defines the batch; input 0's axis 1 follows it.
  std::vector<Signature> s;
  for (int64_t b : {2, 6}) s.push_back(call({{3, b}, {b, 9}}));
  GraphProfile p = infer_profile(s);
  EXPECT_EQ(p.batch_axes, (std::vector<int>{1, 0}));
  EXPECT_EQ(p.axes[0][0].kind, AxisKind::kStatic);
}

TEST(Overrides, WinOverInference) {
  const std::vector<Signature> one{call({{4, 16}, {4, 16}})};
  Overrides ov;
  ov[{0, 0}] = BatchDim{1, 32};
  ov[{0, 1}] = DynamicDim{"seq", 1, 128, std::nullopt};
  ov[{1, 1}] = DynamicDim{"seq", 1, 128, 64};
  GraphProfile p = infer_profile(one, ov);
  EXPECT_EQ(p.axes[0][0], (Axis{AxisKind::kBatch, "batch", 1, 4, 32}));
  EXPECT_EQ(p.axes[0][1], (Axis{AxisKind::kDynamic, "seq", 1, 64, 128}));  // opt shared by name
  EXPECT_EQ(p.axes[1][1], (Axis{AxisKind::kDynamic, "seq", 1, 64, 128}));
  EXPECT_EQ(p.axes[1][0].kind, AxisKind::kStatic);  // one sample: not inferred as batch
  EXPECT_EQ(p.batch_axes, (std::vector<int>{0, -1}));
  EXPECT_EQ(p.min_batch, 1);
  EXPECT_EQ(p.opt_batch, 4);
  EXPECT_EQ(p.max_batch, 32);

  // An int pins an axis that inference would call the batch; the batch then moves to input 1.
  std::vector<Signature> s{call({{2, 5}, {2, 7}}), call({{2, 5}, {6, 7}})};
  ov.clear();
  ov[{0, 0}] = int64_t{2};
  p = infer_profile(s, ov);
  EXPECT_EQ(p.axes[0][0], (Axis{AxisKind::kStatic, "", 2, 2, 2}));
  EXPECT_EQ(p.batch_axes, (std::vector<int>{-1, 0}));
  EXPECT_EQ(p.max_batch, 6);
}

TEST(Overrides, DeclaredNameIsJoinedByMatchingInferredAxis) {
  std::vector<Signature> s{call({{1, 10}, {1, 10}}), call({{1, 20}, {1, 20}})};
  Overrides ov;
  ov[{0, 1}] = DynamicDim{"seq", 1, 512, std::nullopt};
  GraphProfile p = infer_profile(s, ov);
  EXPECT_EQ(p.axes[1][1], (Axis{AxisKind::kDynamic, "seq", 1, 20, 512}));
}

TEST(Overrides, InconsistentOnesAreRejectedWithTheirPlace) {
  const std::vector<Signature> s{call({{4, 16}, {4, 16}})};
  auto err = [&](Overrides ov) { return error_of(s, ov); };
  EXPECT_NE(err({{{0, 1}, DynamicDim{"seq", 1, 128, {}}}, {{1, 1}, DynamicDim{"seq", 1, 256, {}}}})
                .find("input 1 axis 1 has range [1, 256] but input 0 axis 1 declares the same name "
                      "with [1, 128]"),
            std::string::npos);
  EXPECT_NE(
      err({{{0, 1}, DynamicDim{"seq", 64, 8, {}}}}).find("input 0 axis 1 has min 64 and max 8"),
      std::string::npos);
  EXPECT_NE(err({{{0, 1}, DynamicDim{"seq", 1, 64, 100}}}).find("opt 100 outside [1, 64]"),
            std::string::npos);
  EXPECT_NE(err({{{0, 2}, int64_t{3}}}).find("input 0 axis 2, but input 0 has rank 2"),
            std::string::npos);
  EXPECT_NE(err({{{5, 0}, BatchDim{}}}).find("names input 5, but the graph has 2 tensor inputs"),
            std::string::npos);
  EXPECT_NE(err({{{0, 1}, DynamicDim{"batch", 1, 64, {}}}}).find("use BatchDim"),
            std::string::npos);
  EXPECT_NE(err({{{0, 0}, BatchDim{8, 2}}}).find("BatchDim on input 0 axis 0 has min 8 and max 2"),
            std::string::npos);
  EXPECT_NE(err({{{0, 0}, BatchDim{1, 8}}, {{1, 0}, BatchDim{1, 16}}}).find("same min and max"),
            std::string::npos);
  EXPECT_NE(err({{{0, 1}, DynamicDim{"seq", 1, 8, {}}}})
                .find("sample 0 has input 0 axis 1 = 16, outside the range [1, 8]"),
            std::string::npos);
  EXPECT_NE(err({{{0, 1}, int64_t{15}}}).find("sample 0 has input 0 axis 1 = 16"),
            std::string::npos);
  // Two inputs declared as one dim but different in the samples.
  const std::vector<Signature> s2{call({{4, 16}, {4, 9}})};
  EXPECT_NE(
      error_of(s2, {{{0, 1}, DynamicDim{"seq", 1, 64, {}}}, {{1, 1}, DynamicDim{"seq", 1, 64, {}}}})
          .find("share a name but differ in size"),
      std::string::npos);
}

TEST(Infer, RejectsNoSamplesAndMixedGraphs) {
  EXPECT_THROW(infer_profile({}), std::invalid_argument);
  EXPECT_NE(
      error_of({call({{4, 3}}), call({{4, 3}}, "float16")}, {}).find("sample 1 belongs to graph"),
      std::string::npos);
}

TEST(Check, InsideOutsideAndOtherGraphWithReasons) {
  std::vector<Signature> s;
  for (int64_t b : {1, 16, 4}) s.push_back(call({{b, 3}, {b, 5}}));
  const GraphProfile p = infer_profile(s);
  EXPECT_TRUE(check(p, call({{7, 3}, {7, 5}})).ok);
  EXPECT_EQ(check(p, call({{7, 3}, {7, 5}})).reason, "");

  ShapeCheck c = check(p, call({{64, 3}, {64, 5}}));
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.reason,
            "input 0 axis 0 (batch) is 64, outside the tuned range [1, 16]; "
            "input 1 axis 0 (batch) is 64, outside the tuned range [1, 16]");

  c = check(p, call({{2, 4}, {2, 5}}));
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.reason, "input 0 axis 1 is 4, the tuned graph fixes it at 3");

  c = check(p, call({{2, 3}, {4, 5}}));
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(
      c.reason,
      "input 1 axis 0 (batch) is 4 but input 0 axis 0 is 2: axes named 'batch' must be equal");

  c = check(p, call({{2, 3}, {2, 5}}, "float16"));
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.reason.rfind("the input signature ((*,*),{})|float16,cpu,2|float16,cpu,2 is not the "
                           "tuned graph ((*,*),{})|float32,cpu,2|float32,cpu,2",
                           0),
            0u);
}

TEST(Check, SizeRulesMatchSlowCheck) {
  std::vector<Signature> s{call({{1, 8}, {1, 8}}), call({{4, 12}, {4, 12}})};
  const GraphProfile p = infer_profile(s);
  const std::vector<SizeRule> rules = size_rules(p);
  ASSERT_EQ(rules.size(), 4u);
  EXPECT_EQ(rules[2].same_as, 0);
  EXPECT_EQ(rules[3].same_as, 1);
  const std::vector<std::vector<int64_t>> cases = {
      {2, 9, 2, 9}, {2, 9, 3, 9}, {5, 9, 5, 9}, {2, 7, 2, 7}, {4, 12, 4, 12}};
  for (const auto& sizes : cases) {
    EXPECT_EQ(sizes_fit(rules, sizes), check_sizes(p, sizes).ok);
  }
  EXPECT_TRUE(sizes_fit(rules, cases[0]));
  EXPECT_FALSE(sizes_fit(rules, cases[1]));
  EXPECT_FALSE(sizes_fit(rules, std::vector<int64_t>{2, 9, 2}));
}

TEST(Json, RoundTripIsEqual) {
  std::vector<Signature> s;
  const int64_t rows[][2] = {{2, 10}, {4, 20}, {2, 30}};
  for (const auto& r : rows) s.push_back(call({{r[0], r[1]}, {r[0], r[1]}, {3}}));
  Overrides ov{{{2, 0}, DynamicDim{"k", 1, 9, 3}}};
  const GraphProfile p = infer_profile(s, ov);
  const GraphProfile q = profile_from_json(to_json(p));
  EXPECT_EQ(p, q);
  EXPECT_EQ(q.axes[2][0].name, "k");
  EXPECT_THROW(profile_from_json("{\"graph_key\": 3}"), std::invalid_argument);
  EXPECT_THROW(profile_from_json("not json"), std::invalid_argument);
}

TEST(BatchIndices, SliceAndRepeat) {
  EXPECT_EQ(batch_indices(8, 3), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(batch_indices(3, 3), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(batch_indices(3, 7), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0}));
  EXPECT_EQ(batch_indices(1, 4), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_TRUE(batch_indices(5, 0).empty());
  EXPECT_THROW(batch_indices(0, 4), std::invalid_argument);
  EXPECT_THROW(batch_indices(4, -1), std::invalid_argument);
}
