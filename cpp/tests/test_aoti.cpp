// cpp/tests/test_aoti.cpp: AotiContainer refuses what is not an AOTInductor model library, naming
// why (a package built by AOTInductor is opened and run by tests/test_aoti_direct.py).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "honed/aoti.h"

namespace {

std::string open_error(const std::string& library) {
  try {
    honed::AotiContainer::open(library, "cpu", "", /*torch_cxx11_abi=*/true);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Aoti, AFileThatIsNoLibraryIsRefusedByName) {
  const std::string path = testing::TempDir() + "honed_not_a_library.so";
  std::ofstream(path) << "not a library";
  const std::string error = open_error(path);
  std::remove(path.c_str());
  EXPECT_NE(error.find("cannot open the AOTInductor library " + path), std::string::npos) << error;
}

TEST(Aoti, ALibraryWithoutTheInterfaceNamesTheMissingEntryPoint) {
  // The C library opens but exports none of AOTInductor's entry points.
  const std::string error = open_error("libc.so.6");
  EXPECT_NE(error.find("has no AOTInductorModelContainerCreateWithDevice"), std::string::npos)
      << error;
}
