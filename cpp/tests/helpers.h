// cpp/tests/helpers.h: small checks the engine's tests share (one definition: the tests build
// as a unity build, several sources in one translation unit).
#pragma once

#include <string>

namespace honed_test {

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace honed_test
