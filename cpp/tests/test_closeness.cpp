// cpp/tests/test_closeness.cpp: the figures of a check against eager, per element kind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "honed/closeness.h"

namespace honed {
namespace {

TEST(Closeness, FiguresOverTheFinitePositions) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> ref = {1.0, -2.0, 4.0, nan};
  const std::vector<double> out = {1.0, -2.5, 4.0, 7.0};  // eager's NaN: left out
  const Closeness c = closeness(ref.data(), out.data(), ref.size(), FloatKind::F64, 1e-4, 1e-3);
  EXPECT_EQ(c.bad, 0u);
  EXPECT_EQ(c.compared, 3u);
  EXPECT_DOUBLE_EQ(c.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(c.scale, 4.0);
  EXPECT_DOUBLE_EQ(c.max_rel, 0.25);
  EXPECT_FALSE(c.within);
  EXPECT_DOUBLE_EQ(c.cosine, (1 + 5 + 16) / (std::sqrt(21.0) * std::sqrt(1 + 6.25 + 16)));
}

TEST(Closeness, NonFiniteWhereEagerIsFiniteIsCountedAndNamed) {
  const std::vector<float> ref = {1, 2, 3};
  const std::vector<float> inf = {1, std::numeric_limits<float>::infinity(), 3};
  const Closeness c = closeness(ref.data(), inf.data(), 3, FloatKind::F32, 1e-4, 1e-3);
  EXPECT_EQ(c.bad, 1u);
  EXPECT_FALSE(c.bad_nan);
  const std::vector<float> nan = {std::nanf(""), 2, std::nanf("")};
  const Closeness n = closeness(ref.data(), nan.data(), 3, FloatKind::F32, 1e-4, 1e-3);
  EXPECT_EQ(n.bad, 2u);
  EXPECT_TRUE(n.bad_nan);
}

TEST(Closeness, HalfAndBfloat16BitsAreWidenedExactly) {
  // half: 1.0, -2.0, the smallest subnormal (2^-24), the largest finite (65504)
  const std::vector<uint16_t> half = {0x3c00, 0xc000, 0x0001, 0x7bff};
  const std::vector<uint16_t> same = half;
  Closeness c = closeness(half.data(), same.data(), half.size(), FloatKind::F16, 0, 0);
  EXPECT_DOUBLE_EQ(c.scale, 65504.0);
  EXPECT_TRUE(c.within);
  const std::vector<uint16_t> tiny = {0x0001};
  const std::vector<uint16_t> zero = {0x0000};
  c = closeness(tiny.data(), zero.data(), 1, FloatKind::F16, 0, 0);
  EXPECT_DOUBLE_EQ(c.max_abs, std::ldexp(1.0, -24));
  const std::vector<uint16_t> inf = {0x7c00};
  EXPECT_EQ(closeness(tiny.data(), inf.data(), 1, FloatKind::F16, 0, 0).bad, 1u);
  // bfloat16: 1.5 and -0.09375 (0x3fc0, 0xbdc0)
  const std::vector<uint16_t> bf = {0x3fc0, 0xbdc0};
  const std::vector<uint16_t> zeros = {0, 0};
  c = closeness(bf.data(), zeros.data(), 2, FloatKind::BF16, 0, 0);
  EXPECT_DOUBLE_EQ(c.max_abs, 1.5);
  EXPECT_DOUBLE_EQ(c.scale, 1.5);
  EXPECT_DOUBLE_EQ(c.cosine, 0.0);  // one side all zero
}

TEST(Closeness, UnknownDtypeIsRefused) {
  EXPECT_EQ(float_kind("bfloat16"), FloatKind::BF16);
  EXPECT_THROW(float_kind("int8"), std::invalid_argument);
}

}  // namespace
}  // namespace honed
