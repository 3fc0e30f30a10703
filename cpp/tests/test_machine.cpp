// cpp/tests/test_machine.cpp: CPU description, GPU details without NVML, the busy-machine verdict.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "helpers.h"
#include "honed/machine.h"

using honed_test::contains;

namespace {
std::vector<double> steady(double ms, int n) { return std::vector<double>(n, ms); }
}  // namespace

TEST(Machine, ParsesCpuinfo) {
  // Two sockets of two cores with two threads each: 8 logical CPUs, 4 physical cores.
  std::string text;
  for (int socket = 0; socket < 2; ++socket) {
    for (int core = 0; core < 2; ++core) {
      for (int thread = 0; thread < 2; ++thread) {
        text += "processor\t: 0\nmodel name\t: Example CPU @ 3.00GHz\nphysical id\t: " +
                std::to_string(socket) + "\ncore id\t\t: " + std::to_string(core) + "\n\n";
      }
    }
  }
  const honed::CpuInfo info = honed::parse_cpuinfo(text, 8);
  EXPECT_EQ(info.model, "Example CPU @ 3.00GHz");
  EXPECT_EQ(info.logical_cpus, 8);
  EXPECT_EQ(info.physical_cores, 4);
  // A process allowed 2 CPUs uses at most 2 cores.
  EXPECT_EQ(honed::parse_cpuinfo(text, 2).physical_cores, 2);
  // ARM-style text without core ids: the logical CPUs, and the "Hardware" line as the model.
  const honed::CpuInfo arm = honed::parse_cpuinfo("processor : 0\nHardware : Example SoC\n", 4);
  EXPECT_EQ(arm.model, "Example SoC");
  EXPECT_EQ(arm.physical_cores, 4);
}

TEST(Machine, ProbesThisCpu) {
  const honed::CpuInfo info = honed::probe_cpu();
  EXPECT_GE(info.logical_cpus, 1);
  EXPECT_GE(info.physical_cores, 1);
  EXPECT_LE(info.physical_cores, info.logical_cpus);
  EXPECT_EQ(honed::probe_cpu("/nonexistent/cpuinfo").model, "");
}

TEST(Machine, GpuDetailsWithoutNvmlSayWhy) {
  const honed::GpuDetails d = honed::probe_gpu_details("0", "libnvidia-ml-missing.so.1");
  EXPECT_FALSE(d.nvml);
  EXPECT_TRUE(contains(d.error, "libnvidia-ml-missing.so.1 could not be loaded")) << d.error;
  EXPECT_EQ(d.sm_clock_mhz, -1);
  EXPECT_EQ(d.power_limit_w, -1);
  EXPECT_FALSE(d.processes_known);
}

TEST(Machine, OtherProcessesLeaveOutThisOne) {
  EXPECT_EQ(honed::other_processes({10, 11, 12}, {11}, true), 2);
  // This process holds a context but NVML numbers it differently (a container): one less.
  EXPECT_EQ(honed::other_processes({900, 901}, {11}, true), 1);
  EXPECT_EQ(honed::other_processes({900, 901}, {11}, false), 2);
  EXPECT_EQ(honed::other_processes({}, {11}, true), 0);
}

TEST(Machine, QuietSignalsAreQuiet) {
  honed::LoadSignals s;
  s.calibration_ms = steady(0.5, 60);
  s.load_avg_1m = 0.4;
  s.logical_cpus = 8;
  s.gpu_other_processes = 0;
  const honed::LoadVerdict v = honed::assess_load(s);
  EXPECT_FALSE(v.busy);
  EXPECT_DOUBLE_EQ(v.slowdown, 1.0);
  EXPECT_DOUBLE_EQ(v.load_per_cpu, 0.05);
  EXPECT_TRUE(v.reasons.empty());
  EXPECT_EQ(v.summary,
            "quiet (CPU calibration 1.00x slower than its fastest chunk; load average 0.4 on 8 "
            "CPUs; no other process on the GPU)");
}

TEST(Machine, EachSignalCanMakeItBusy) {
  // Time slices lost to other programs: a third of the chunks take 4x as long.
  honed::LoadSignals s;
  for (int i = 0; i < 60; ++i) s.calibration_ms.push_back(i % 3 == 0 ? 2.0 : 0.5);
  honed::LoadVerdict v = honed::assess_load(s);
  EXPECT_TRUE(v.busy);
  EXPECT_DOUBLE_EQ(v.slowdown, 2.0);
  EXPECT_EQ(v.summary, "busy: CPU calibration 2.00x slower than its fastest chunk");

  s = {};
  s.load_avg_1m = 18.6;
  s.logical_cpus = 2;
  v = honed::assess_load(s);
  EXPECT_TRUE(v.busy);
  EXPECT_EQ(v.summary, "busy: load average 18.6 on 2 CPUs");

  s = {};
  s.gpu_other_processes = 2;
  v = honed::assess_load(s);
  EXPECT_TRUE(v.busy);
  EXPECT_EQ(v.summary, "busy: 2 other processes on the GPU");

  // The limits are parameters.
  s = {};
  s.load_avg_1m = 3;
  s.logical_cpus = 2;
  EXPECT_TRUE(honed::assess_load(s).busy);
  EXPECT_FALSE(honed::assess_load(s, {1.5, 2.0}).busy);
  EXPECT_EQ(honed::assess_load({}).summary, "quiet");
}

TEST(Machine, CalibrationTimesEveryChunkOfEveryThread) {
  const std::vector<double> ms = honed::calibrate_cpu(2, 5, 0.05);
  ASSERT_EQ(ms.size(), 10u);
  for (double x : ms) EXPECT_GT(x, 0);
}
