// cpp/tests/test_env.cpp: CUDA version strings, the driver diagnosis and probing without a driver.
#include <gtest/gtest.h>

#include <string>

#include "helpers.h"
#include "honed/env.h"

using honed::diagnose_driver;
using honed::DriverDiagnosis;

using honed_test::contains;

TEST(Env, CudaVersionString) {
  EXPECT_EQ(honed::cuda_version_string(12080), "12.8");
  EXPECT_EQ(honed::cuda_version_string(13000), "13.0");
  EXPECT_EQ(honed::cuda_version_string(11020), "11.2");
  EXPECT_EQ(honed::cuda_version_string(0), "");
}

TEST(Env, ParseCudaVersion) {
  EXPECT_EQ(honed::parse_cuda_version("13.0"), 13000);
  EXPECT_EQ(honed::parse_cuda_version("12.8"), 12080);
  EXPECT_EQ(honed::parse_cuda_version("11.8.89"), 11080);
  EXPECT_EQ(honed::parse_cuda_version("12"), 12000);
  EXPECT_EQ(honed::parse_cuda_version(""), -1);
  EXPECT_EQ(honed::parse_cuda_version("cu130"), -1);
  EXPECT_EQ(honed::parse_cuda_version("12."), -1);
  EXPECT_EQ(honed::parse_cuda_version("-12.0"), -1);
  EXPECT_EQ(honed::parse_cuda_version(" 12.0"), -1);
  EXPECT_EQ(honed::parse_cuda_version("12.8x"), -1);
}

TEST(Env, VersionsRoundTrip) {
  for (const int v : {11080, 12010, 12080, 12090, 13000}) {
    EXPECT_EQ(honed::parse_cuda_version(honed::cuda_version_string(v)), v);
  }
}

TEST(Env, BestTorchCudaBuild) {
  EXPECT_EQ(honed::best_torch_cuda_build(12080), "cu128");
  EXPECT_EQ(honed::best_torch_cuda_build(12070), "cu126");
  EXPECT_EQ(honed::best_torch_cuda_build(12020), "cu121");
  EXPECT_EQ(honed::best_torch_cuda_build(13020), "cu130");
  EXPECT_EQ(honed::best_torch_cuda_build(11080), "cu118");
  EXPECT_EQ(honed::best_torch_cuda_build(11070), "");
}

TEST(Env, SeedDriverTooOldForCu130) {
  const DriverDiagnosis d = diagnose_driver(12080, "2.11.0+cu130", "13.0");
  EXPECT_FALSE(d.ok);
  EXPECT_EQ(d.message, "this driver supports CUDA 12.8; torch 2.11.0+cu130 needs 13.0");
  EXPECT_EQ(d.fix,
            "install a +cu128 build of torch (pip install torch --index-url "
            "https://download.pytorch.org/whl/cu128) or update the NVIDIA driver");
}

TEST(Env, NewerOrEqualDriverIsOk) {
  const DriverDiagnosis same = diagnose_driver(13000, "2.11.0+cu130", "13.0");
  EXPECT_TRUE(same.ok);
  EXPECT_EQ(same.fix, "");
  const DriverDiagnosis newer = diagnose_driver(13020, "2.6.0+cu124", "12.4");
  EXPECT_TRUE(newer.ok);
  EXPECT_EQ(newer.message, "this driver supports CUDA 13.2; torch 2.6.0+cu124 needs 12.4");
}

TEST(Env, OlderMinorOfTheSameMajorRunsWithANote) {
  const DriverDiagnosis d = diagnose_driver(12040, "2.8.0+cu128", "12.8");
  EXPECT_TRUE(d.ok);
  EXPECT_TRUE(contains(d.message, "minor-version compatibility")) << d.message;
  EXPECT_TRUE(contains(d.fix, "+cu124")) << d.fix;
}

TEST(Env, DriverOlderThanEveryBuild) {
  const DriverDiagnosis d = diagnose_driver(10020, "2.11.0+cu130", "13.0");
  EXPECT_FALSE(d.ok);
  EXPECT_EQ(d.message, "this driver supports CUDA 10.2; torch 2.11.0+cu130 needs 13.0");
  EXPECT_TRUE(contains(d.fix, "update the NVIDIA driver")) << d.fix;
  EXPECT_FALSE(contains(d.fix, "pip install")) << d.fix;
}

TEST(Env, CpuOnlyTorch) {
  const DriverDiagnosis d = diagnose_driver(12080, "2.13.0+cpu", "");
  EXPECT_FALSE(d.ok);
  EXPECT_EQ(d.message, "torch 2.13.0+cpu is a CPU-only build");
  EXPECT_EQ(d.fix,
            "install a CUDA build of torch (pip install torch --index-url "
            "https://download.pytorch.org/whl/cu128)");
  const DriverDiagnosis no_driver = diagnose_driver(0, "2.13.0+cpu", "");
  EXPECT_FALSE(no_driver.ok);
  EXPECT_EQ(no_driver.fix.rfind("install the NVIDIA driver, then install a CUDA build", 0), 0u);
}

TEST(Env, NoDriverWithCudaTorch) {
  const DriverDiagnosis d = diagnose_driver(0, "2.11.0+cu130", "13.0");
  EXPECT_FALSE(d.ok);
  EXPECT_EQ(d.message,
            "no NVIDIA driver was found; torch 2.11.0+cu130 needs one that supports "
            "CUDA 13.0");
}

TEST(Env, UnreadableTorchCudaVersion) {
  const DriverDiagnosis d = diagnose_driver(12080, "2.11.0+weird", "thirteen");
  EXPECT_FALSE(d.ok);
  EXPECT_TRUE(contains(d.message, "'thirteen'")) << d.message;
}

TEST(Env, ProbeWithoutADriverIsNotAnError) {
  const honed::GpuProbe p =
      honed::probe_gpus("libhoned-no-such-cuda.so.1", "libhoned-no-such-nvml.so.1");
  EXPECT_FALSE(p.driver_loaded);
  EXPECT_TRUE(contains(p.error, "libhoned-no-such-cuda.so.1 could not be loaded")) << p.error;
  EXPECT_EQ(p.driver_cuda_version, 0);
  EXPECT_EQ(p.driver_version, "");
  EXPECT_TRUE(p.gpus.empty());
}

TEST(Env, ProbeOfThisMachineIsConsistent) {
  const honed::GpuProbe p = honed::probe_gpus();
  if (!p.driver_loaded) {
    EXPECT_FALSE(p.error.empty());
    EXPECT_TRUE(p.gpus.empty());
    return;
  }
  EXPECT_GT(p.driver_cuda_version, 0);
  for (size_t i = 0; i < p.gpus.size(); ++i) {
    EXPECT_EQ(p.gpus[i].index, static_cast<int>(i));
    EXPECT_FALSE(p.gpus[i].name.empty());
    EXPECT_GE(p.gpus[i].cc_major, 3);
    EXPECT_GT(p.gpus[i].total_memory_bytes, int64_t{1} << 30);
  }
}
