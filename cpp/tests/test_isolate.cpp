// cpp/tests/test_isolate.cpp: run_isolated with small sh/python3 children: exits, crashes, limits.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "honed/isolate.h"

using honed::IsolateOptions;
using honed::IsolateResult;
using honed::run_isolated;

namespace {

IsolateOptions sh(const std::string& script) {
  IsolateOptions o;
  o.argv = {"sh", "-c", script};
  return o;
}

// Whether pid is gone (or a zombie nobody will run again).
bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');
  return paren != std::string::npos && line.size() > paren + 2 && line[paren + 2] == 'Z';
}

bool gone_within(pid_t pid, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    if (process_gone(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return process_gone(pid);
}

pid_t read_pid(const std::string& path) {
  std::ifstream f(path);
  long pid = 0;
  f >> pid;
  return static_cast<pid_t>(pid);
}

std::string temp_path(const char* name) {
  return testing::TempDir() + "honed_isolate_" + std::to_string(getpid()) + "_" + name;
}

}  // namespace

TEST(Isolate, ExitZeroCapturesStdoutAndStderr) {
  const IsolateResult r = run_isolated(sh("echo hello; echo oops >&2"));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.stdout_tail, "hello\n");
  EXPECT_EQ(r.stderr_tail, "oops\n");
  EXPECT_EQ(r.summary(), "ok");
  EXPECT_GT(r.wall_s, 0.0);
  EXPECT_GT(r.peak_rss_bytes, 0);
}

TEST(Isolate, ExitStatus) {
  const IsolateResult r = run_isolated(sh("exit 3"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.signal, 0);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.summary(), "exited with status 3");
}

TEST(Isolate, SegfaultIsACrash) {
  const IsolateResult r = run_isolated(sh("kill -SEGV $$"));
  EXPECT_EQ(r.signal, SIGSEGV);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_EQ(r.summary(), "crashed: segmentation fault (SIGSEGV)");
}

TEST(Isolate, AbortIsACrash) {
  const IsolateResult r = run_isolated(sh("kill -ABRT $$"));
  EXPECT_EQ(r.signal, SIGABRT);
  EXPECT_EQ(r.summary(), "crashed: aborted (SIGABRT)");
}

TEST(Isolate, SigkillNamesTheOomKiller) {
  const IsolateResult r = run_isolated(sh("kill -KILL $$"));
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_FALSE(r.memory_exceeded);
  EXPECT_EQ(r.summary(), "killed by SIGKILL (often the kernel's out-of-memory killer)");
}

TEST(Isolate, TimeoutKillsQuickly) {
  IsolateOptions o = sh("sleep 30");
  o.timeout_s = 0.3;
  const IsolateResult r = run_isolated(o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.ok());
  EXPECT_GE(r.wall_s, 0.3);
  EXPECT_LT(r.wall_s, 2.0);
  EXPECT_EQ(r.summary(), "killed after the 0.3 s timeout");
}

TEST(Isolate, TimeoutEscalatesToSigkillWhenTermIsIgnored) {
  IsolateOptions o = sh("trap '' TERM; while :; do sleep 0.05; done");
  o.timeout_s = 0.2;
  o.kill_grace_s = 0.2;
  const IsolateResult r = run_isolated(o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_LT(r.wall_s, 2.0);
}

TEST(Isolate, MemoryCeilingKillsTheChild) {
  IsolateOptions o;
  o.argv = {"python3", "-c", "b = bytearray(500 << 20); import time; time.sleep(5)"};
  o.memory_limit_bytes = 100ll << 20;
  const IsolateResult r = run_isolated(o);
  EXPECT_TRUE(r.memory_exceeded);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_GT(r.peak_rss_bytes, 100ll << 20);
  EXPECT_LT(r.wall_s, 4.0);
  EXPECT_EQ(r.summary(), "out of memory: resident memory passed the 100 MiB ceiling");
}

TEST(Isolate, MemoryCeilingCountsTheGroup) {
  // Two grandchildren of 60 MiB each: neither passes 100 MiB alone, the group does.
  IsolateOptions o = sh(
      "for i in 1 2; do python3 -c 'b = bytearray(60 << 20); import time; time.sleep(5)' & done; "
      "wait");
  o.memory_limit_bytes = 100ll << 20;
  const IsolateResult r = run_isolated(o);
  EXPECT_TRUE(r.memory_exceeded);
  EXPECT_GT(r.peak_rss_bytes, 100ll << 20);
  EXPECT_LT(r.wall_s, 4.0);
}

TEST(Isolate, StderrTailIsBounded) {
  IsolateOptions o = sh("i=0; while [ $i -lt 2000 ]; do echo line$i >&2; i=$((i+1)); done");
  o.tail_bytes = 100;
  const IsolateResult r = run_isolated(o);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.stderr_tail.size(), 100u);
  EXPECT_EQ(r.stderr_tail.substr(r.stderr_tail.size() - 9), "line1999\n");
}

TEST(Isolate, LargeOutputOnBothPipesDoesNotBlock) {
  // Far more than a pipe buffer (64 KiB) on each stream.
  IsolateOptions o = sh("head -c 1000000 /dev/zero; head -c 1000000 /dev/zero >&2; echo end");
  o.timeout_s = 10;
  const IsolateResult r = run_isolated(o);
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.stdout_tail.size(), 8192u);
  EXPECT_EQ(r.stdout_tail.substr(r.stdout_tail.size() - 4), "end\n");
}

TEST(Isolate, CancelCallbackStopsTheChild) {
  IsolateOptions o = sh("sleep 30");
  int calls = 0;
  const IsolateResult r = run_isolated(o, [&] { return ++calls >= 3; });
  EXPECT_TRUE(r.cancelled);
  EXPECT_EQ(calls, 3);
  EXPECT_LT(r.wall_s, 2.0);
  EXPECT_EQ(r.summary(), "cancelled");
}

TEST(Isolate, ThrowingCancelKillsAndPropagates) {
  const std::string pid_file = temp_path("throw_pid");
  IsolateOptions o = sh("echo $$ > " + pid_file + "; exec sleep 30");
  int calls = 0;
  EXPECT_THROW(run_isolated(o,
                            [&]() -> bool {
                              if (++calls >= 10) throw std::runtime_error("stop");
                              return false;
                            }),
               std::runtime_error);
  const pid_t pid = read_pid(pid_file);
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(gone_within(pid, 2.0));
  std::remove(pid_file.c_str());
}

TEST(Isolate, GrandchildrenDieWithTheGroup) {
  const std::string pid_file = temp_path("grandchild_pid");
  IsolateOptions o = sh("sleep 30 & echo $! > " + pid_file + "; wait");
  o.timeout_s = 0.3;
  const IsolateResult r = run_isolated(o);
  EXPECT_TRUE(r.timed_out);
  const pid_t grandchild = read_pid(pid_file);
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(gone_within(grandchild, 2.0));
  std::remove(pid_file.c_str());
}

TEST(Isolate, LeftoversAreKilledWhenTheChildExits) {
  const std::string pid_file = temp_path("leftover_pid");
  const IsolateResult r = run_isolated(sh("sleep 30 & echo $! > " + pid_file + "; exit 0"));
  EXPECT_TRUE(r.ok());
  EXPECT_LT(r.wall_s, 2.0);
  const pid_t leftover = read_pid(pid_file);
  ASSERT_GT(leftover, 0);
  EXPECT_TRUE(gone_within(leftover, 2.0));
  std::remove(pid_file.c_str());
}

TEST(Isolate, EnvironmentAndWorkingDirectory) {
  IsolateOptions o = sh("echo \"$HONED_TEST_VAR $(pwd)\"");
  o.env = {{"HONED_TEST_VAR", "first"}, {"HONED_TEST_VAR", "second"}};
  o.cwd = "/";
  const IsolateResult r = run_isolated(o);
  EXPECT_EQ(r.stdout_tail, "second /\n");
}

TEST(Isolate, ChildHasItsOwnProcessGroup) {
  // Field 5 of /proc/<pid>/stat is the process group (sh's comm has no spaces).
  const IsolateResult r = run_isolated(sh("cut -d' ' -f5 /proc/$$/stat; echo $$"));
  ASSERT_TRUE(r.ok());
  long pgid = 0, pid = 0;
  ASSERT_EQ(std::sscanf(r.stdout_tail.c_str(), "%ld %ld", &pgid, &pid), 2);
  EXPECT_EQ(pgid, pid);
  EXPECT_NE(pgid, static_cast<long>(getpgrp()));
}

TEST(Isolate, MissingProgramIsAStartError) {
  IsolateOptions o;
  o.argv = {"honed-no-such-program", "x"};
  const IsolateResult r = run_isolated(o);
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_NE(r.start_error.find("'honed-no-such-program' was not found on PATH"), std::string::npos);
  EXPECT_EQ(r.stderr_tail, r.start_error);
  EXPECT_EQ(r.summary().rfind("could not start: ", 0), 0u);
}

TEST(Isolate, UnexecutablePathIsAStartError) {
  IsolateOptions o;
  o.argv = {"/proc/version"};
  const IsolateResult r = run_isolated(o);
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_NE(r.start_error.find("cannot run '/proc/version'"), std::string::npos);
}

TEST(Isolate, BadWorkingDirectoryIsAStartError) {
  IsolateOptions o = sh("true");
  o.cwd = "/honed/no/such/dir";
  const IsolateResult r = run_isolated(o);
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_NE(r.start_error.find("cannot change to directory '/honed/no/such/dir'"),
            std::string::npos);
}

TEST(Isolate, EmptyArgvThrows) {
  EXPECT_THROW(run_isolated(IsolateOptions{}), std::invalid_argument);
}

TEST(Isolate, FormatBytes) {
  EXPECT_EQ(honed::format_bytes(2ll << 30), "2.0 GiB");
  EXPECT_EQ(honed::format_bytes(100ll << 20), "100 MiB");
  EXPECT_EQ(honed::format_bytes(3ll << 19), "1.5 MiB");
  EXPECT_EQ(honed::format_bytes(512), "512 bytes");
}

TEST(Isolate, SummaryOfEachOutcome) {
  IsolateResult r;
  r.timeout_s = 30;
  r.timed_out = true;
  EXPECT_EQ(r.summary(), "killed after the 30 s timeout");
  r = IsolateResult{};
  r.memory_exceeded = true;
  r.memory_limit_bytes = 2ll << 30;
  EXPECT_EQ(r.summary(), "out of memory: resident memory passed the 2.0 GiB ceiling");
  r = IsolateResult{};
  r.signal = SIGTERM;
  EXPECT_EQ(r.summary(), "killed by SIGTERM");
}
