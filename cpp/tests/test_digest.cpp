// cpp/tests/test_digest.cpp: honed::Sha256 over bytes and host memory; what it refuses.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "honed/artifact.h"
#include "honed/digest.h"

namespace honed {
namespace {

uintptr_t address(const std::string& s) { return reinterpret_cast<uintptr_t>(s.data()); }

TEST(Digest, KnownValues) {
  Sha256 empty;
  EXPECT_EQ(empty.hexdigest(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 abc;
  abc.update({DigestPart{"ab"}, DigestPart{"c"}});
  EXPECT_EQ(abc.hexdigest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Digest, PartsInOrderEqualTheWholeBytes) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  Sha256 pieces;
  pieces.update({DigestPart{{}, address(data), 40000, false}, DigestPart{"-"}});
  pieces.update({DigestPart{{}, address(data) + 40000, 60000, false}});
  pieces.update(nullptr, 0);
  std::string whole = data.substr(0, 40000) + "-" + data.substr(40000);
  EXPECT_EQ(pieces.hexdigest(), sha256_hex(whole));
}

TEST(Digest, RefusesGpuBytesWithoutStagingAndUseAfterTheEnd) {
  const std::string data(16, 'x');
  Sha256 h;
  EXPECT_THROW(h.update({DigestPart{{}, address(data), data.size(), true}}), std::invalid_argument);
  Sha256 done;
  done.hexdigest();
  EXPECT_THROW(done.update({DigestPart{"late"}}), std::logic_error);
  EXPECT_THROW(done.hexdigest(), std::logic_error);
}

}  // namespace
}  // namespace honed
