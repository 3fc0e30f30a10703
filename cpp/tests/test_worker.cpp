// cpp/tests/test_worker.cpp: Worker with a python3 echo child: messages, crashes, limits, trees.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "honed/worker.h"

using honed::IsolateOptions;
using honed::Worker;
using honed::WorkerEvent;

namespace {

// Reads length-prefixed messages on fd 3 and answers each: "crash" segfaults, "exit0" exits 0
// without a reply, "hog" allocates 400 MiB in a grandchild, "setsid PATH" starts a sleeper in
// its own session and writes its pid to PATH, anything else comes back reversed.
const char* kEcho = R"PY(
import os, struct, subprocess, sys
def recv():
    data = b""
    while len(data) < 8:
        chunk = os.read(3, 8 - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    n = struct.unpack("<Q", data)[0]
    body = b""
    while len(body) < n:
        body += os.read(3, n - len(body))
    return body
def send(b):
    os.write(3, struct.pack("<Q", len(b)) + b)
while True:
    m = recv()
    if m == b"crash":
        os.kill(os.getpid(), 11)
    elif m == b"exit0":
        os._exit(0)
    elif m == b"hog":
        subprocess.Popen([sys.executable, "-c", "b = bytearray(400 << 20); import time; time.sleep(30)"])
    elif m.startswith(b"setsid "):
        p = subprocess.Popen(["sleep", "300"], start_new_session=True)
        open(m[7:].decode(), "w").write(str(p.pid))
        send(b"started")
    else:
        print("echo", len(m), flush=True)
        send(m[::-1])
)PY";

IsolateOptions echo() {
  IsolateOptions o;
  o.argv = {"python3", "-c", kEcho};
  o.poll_ms = 20;
  return o;
}

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

}  // namespace

TEST(Worker, MessagesGoBothWaysAndOutputIsKept) {
  Worker w(echo());
  ASSERT_TRUE(w.running());
  ASSERT_EQ(w.send("hello", 10).kind, WorkerEvent::Kind::sent);
  const WorkerEvent e = w.receive(30);
  ASSERT_EQ(e.kind, WorkerEvent::Kind::message);
  EXPECT_EQ(e.message, "olleh");
  EXPECT_EQ(w.take_output().first, "echo 5\n");
  EXPECT_EQ(w.take_output().first, "");
  const std::string big(8 << 20, 'x');  // larger than the socket's buffer
  ASSERT_EQ(w.send(big, 10).kind, WorkerEvent::Kind::sent);
  EXPECT_EQ(w.receive(30).message.size(), big.size());
  EXPECT_EQ(w.receive(0.05).kind, WorkerEvent::Kind::timed_out);
  EXPECT_TRUE(w.running());  // a receive that timed out leaves it be
}

TEST(Worker, CrashEndsItAndSaysHow) {
  Worker w(echo());
  w.send("crash", 10);
  const WorkerEvent e = w.receive(30);
  ASSERT_EQ(e.kind, WorkerEvent::Kind::ended);
  EXPECT_EQ(e.ended.signal, SIGSEGV);
  EXPECT_EQ(e.ended.summary(), "crashed: segmentation fault (SIGSEGV)");
  EXPECT_FALSE(w.running());
  EXPECT_EQ(w.pid(), -1);
  EXPECT_EQ(w.receive(1).kind, WorkerEvent::Kind::ended);
  EXPECT_EQ(w.send("again", 1).kind, WorkerEvent::Kind::ended);
}

TEST(Worker, ExitWithoutAReplyIsAnEndWithStatusZero) {
  Worker w(echo());
  w.send("exit0", 10);
  const WorkerEvent e = w.receive(30);
  ASSERT_EQ(e.kind, WorkerEvent::Kind::ended);
  EXPECT_EQ(e.ended.exit_code, 0);
  EXPECT_EQ(e.ended.signal, 0);
}

TEST(Worker, MemoryCeilingCountsTheTree) {
  IsolateOptions o = echo();
  o.memory_limit_bytes = 300ll << 20;
  Worker w(o);
  w.send("hog", 10);
  const WorkerEvent e = w.receive(30);
  ASSERT_EQ(e.kind, WorkerEvent::Kind::ended);
  EXPECT_TRUE(e.ended.memory_exceeded);
  EXPECT_EQ(e.ended.summary(), "out of memory: resident memory passed the 300 MiB ceiling");
}

TEST(Worker, StopEndsWhatLeftTheGroup) {
  const std::string path = testing::TempDir() + "honed_worker_setsid_" + std::to_string(getpid());
  Worker w(echo());
  w.send("setsid " + path, 10);
  ASSERT_EQ(w.receive(30).message, "started");
  long sleeper = 0;
  std::ifstream(path) >> sleeper;
  ASSERT_GT(sleeper, 0);
  EXPECT_FALSE(process_gone(static_cast<pid_t>(sleeper)));
  const honed::IsolateResult r = w.stop(5.0);
  EXPECT_EQ(r.exit_code, 0);  // it read EOF and left by itself
  EXPECT_TRUE(gone_within(static_cast<pid_t>(sleeper), 5.0));
  std::remove(path.c_str());
}

TEST(Worker, CancelFromAnotherThreadEndsAWait) {
  Worker w(echo());
  std::thread other([&] { w.cancel(); });  // before or during the wait: the same outcome
  const pid_t pid = w.pid();
  const WorkerEvent e = w.receive(60);
  other.join();
  EXPECT_EQ(e.kind, WorkerEvent::Kind::cancelled);
  EXPECT_TRUE(e.ended.cancelled);
  EXPECT_TRUE(gone_within(pid, 2.0));
}

TEST(Worker, MissingProgramIsAStartError) {
  IsolateOptions o;
  o.argv = {"honed-no-such-program"};
  Worker w(o);
  EXPECT_FALSE(w.running());
  EXPECT_NE(w.start_error().find("was not found on PATH"), std::string::npos);
  EXPECT_EQ(w.receive(1).kind, WorkerEvent::Kind::ended);
}
