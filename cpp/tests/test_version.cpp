// cpp/tests/test_version.cpp: the engine reports a MAJOR.MINOR.PATCH version.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "honed/version.h"

TEST(Version, HasThreeNumericParts) {
  const std::string v = honed::version();
  EXPECT_EQ(std::count(v.begin(), v.end(), '.'), 2);
  EXPECT_TRUE(
      std::all_of(v.begin(), v.end(), [](char c) { return c == '.' || (c >= '0' && c <= '9'); }));
}
