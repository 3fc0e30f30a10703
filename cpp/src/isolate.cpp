// cpp/src/isolate.cpp: run_isolated: one child watched to its end (timeout, memory, cancel).
#include "honed/isolate.h"

#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef __linux__
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "process.h"
#endif

namespace honed {

bool IsolateResult::ok() const {
  return exit_code == 0 && signal == 0 && !timed_out && !cancelled && !memory_exceeded &&
         start_error.empty();
}

std::string format_bytes(int64_t bytes) {
  constexpr double mib = 1024.0 * 1024.0;
  constexpr double gib = 1024.0 * mib;
  char buf[64];
  const auto b = static_cast<double>(bytes);
  if (b >= gib) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / gib);
  } else if (b >= 10 * mib) {
    std::snprintf(buf, sizeof buf, "%.0f MiB", b / mib);
  } else if (b >= mib) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / mib);
  } else {
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  }
  return buf;
}

namespace {

struct KnownSignal {
  int sig;
  const char* what;
  const char* name;
};

const KnownSignal* find_signal(int sig) {
  static const KnownSignal known[] = {
      {SIGSEGV, "segmentation fault", "SIGSEGV"},
      {SIGABRT, "aborted", "SIGABRT"},
      {SIGBUS, "bus error", "SIGBUS"},
      {SIGFPE, "floating-point exception", "SIGFPE"},
      {SIGILL, "illegal instruction", "SIGILL"},
      {SIGTRAP, "trace/breakpoint trap", "SIGTRAP"},
      {SIGSYS, "bad system call", "SIGSYS"},
      {SIGKILL, "killed", "SIGKILL"},
      {SIGTERM, "terminated", "SIGTERM"},
      {SIGINT, "interrupted", "SIGINT"},
      {SIGQUIT, "quit", "SIGQUIT"},
      {SIGHUP, "hangup", "SIGHUP"},
      {SIGPIPE, "broken pipe", "SIGPIPE"},
      {SIGXCPU, "CPU time limit exceeded", "SIGXCPU"},
  };
  for (const KnownSignal& k : known) {
    if (k.sig == sig) return &k;
  }
  return nullptr;
}

}  // namespace

std::string describe_signal(int sig) {
  const KnownSignal* k = find_signal(sig);
  return k ? std::string(k->what) + " (" + k->name + ")" : "signal " + std::to_string(sig);
}

std::string signal_name(int sig) {
  const KnownSignal* k = find_signal(sig);
  return k ? k->name : "signal " + std::to_string(sig);
}

std::string IsolateResult::summary() const {
  char buf[128];
  if (!start_error.empty()) return "could not start: " + start_error;
  if (cancelled) return "cancelled";
  if (timed_out) {
    std::snprintf(buf, sizeof buf, "killed after the %g s timeout", timeout_s);
    return buf;
  }
  if (memory_exceeded) {
    return "out of memory: resident memory passed the " + format_bytes(memory_limit_bytes) +
           " ceiling";
  }
  if (signal == SIGKILL) return "killed by SIGKILL (often the kernel's out-of-memory killer)";
  if (signal == SIGTERM || signal == SIGINT || signal == SIGHUP || signal == SIGQUIT) {
    return "killed by " + signal_name(signal);
  }
  if (signal != 0) return "crashed: " + describe_signal(signal);
  if (exit_code != 0) return "exited with status " + std::to_string(exit_code);
  return "ok";
}

#ifdef __linux__

namespace {

using detail::Clock;
using detail::seconds_since;
using detail::Stream;

// Waits up to wait_ms for output and reads what came.
void pump(Stream* streams, size_t count, size_t keep, int wait_ms) {
  pollfd fds[2];
  nfds_t n = 0;
  for (size_t i = 0; i < count; ++i) {
    if (streams[i].fd >= 0) fds[n++] = pollfd{streams[i].fd, POLLIN, 0};
  }
  if (poll(fds, n, std::max(wait_ms, 0)) <= 0) return;  // timeout, or EINTR: the caller checks
  for (size_t i = 0; i < count; ++i) detail::drain(streams[i], keep);
}

class Runner {
 public:
  Runner(const IsolateOptions& o, const std::function<bool()>& should_cancel)
      : o_(o), should_cancel_(should_cancel), keep_(o.tail_bytes) {
    r_.timeout_s = o.timeout_s;
    r_.memory_limit_bytes = o.memory_limit_bytes;
  }

  IsolateResult run() {
    const detail::ChildPlan plan = detail::make_plan(o_);
    start_ = Clock::now();
    const detail::Started started = detail::start_child(plan, false);
    if (!started.start_error.empty()) return start_failed(started.start_error);
    pid_ = started.pid;
    streams_[0].fd = started.out;
    streams_[1].fd = started.err;
    watch();
    reap();
    detail::kill_marked(plan.marker);  // what left the group (setsid) and outlived the child
    finish_streams();
    return r_;
  }

 private:
  IsolateResult start_failed(const std::string& why) {
    r_.exit_code = 127;
    r_.start_error = why;
    r_.stderr_tail = why;
    return r_;
  }

  // The poll loop: output as it comes; every poll_ms the exit, timeout, memory and cancel.
  void watch() {
    const double poll_s = std::max(o_.poll_ms, 1.0) / 1000.0;
    auto next_check = Clock::now();
    while (true) {
      const double wait_s = std::chrono::duration<double>(next_check - Clock::now()).count();
      pump(streams_, 2, keep_, static_cast<int>(std::ceil(wait_s * 1000.0)));
      if (Clock::now() < next_check) continue;
      next_check = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(poll_s));
      if (detail::child_exited(pid_, lost_)) return;
      const int64_t rss = o_.memory_limit_bytes > 0 ? detail::group_resident_bytes(pid_)
                                                    : detail::resident_bytes(pid_);
      r_.peak_rss_bytes = std::max(r_.peak_rss_bytes, rss);
      if (o_.timeout_s > 0 && seconds_since(start_) >= o_.timeout_s) {
        r_.timed_out = true;
        return terminate_group();
      }
      if (o_.memory_limit_bytes > 0 && rss > o_.memory_limit_bytes) {
        r_.memory_exceeded = true;
        kill(-pid_, SIGKILL);
        return;
      }
      if (should_cancel_ && cancel_requested()) {
        r_.cancelled = true;
        return terminate_group();
      }
    }
  }

  bool cancel_requested() {
    try {
      return should_cancel_();
    } catch (...) {
      kill(-pid_, SIGKILL);
      reap();
      close_streams();
      throw;
    }
  }

  // SIGTERM to the group, up to kill_grace_s for the child to go, then SIGKILL to the group.
  void terminate_group() {
    kill(-pid_, SIGTERM);
    const auto t0 = Clock::now();
    while (seconds_since(t0) < o_.kill_grace_s && !detail::child_exited(pid_, lost_)) {
      pump(streams_, 2, keep_, 10);
    }
    if (!lost_) kill(-pid_, SIGKILL);
  }

  // Kills what the child left in its group (it is a zombie until reaped: the group id is still
  // its own), then reaps it.
  void reap() { detail::reap_into(pid_, lost_, start_, r_); }

  // Reads what is left; a process that escaped the group may hold a pipe open, so not forever.
  void finish_streams() {
    const auto t0 = Clock::now();
    while ((streams_[0].fd >= 0 || streams_[1].fd >= 0) && seconds_since(t0) < 2.0) {
      pump(streams_, 2, keep_, 50);
    }
    close_streams();
    r_.stdout_tail = std::move(streams_[0].tail);
    r_.stderr_tail = std::move(streams_[1].tail);
  }

  void close_streams() {
    for (Stream& s : streams_) {
      if (s.fd >= 0) close(s.fd);
      s.fd = -1;
    }
  }

  const IsolateOptions& o_;
  const std::function<bool()>& should_cancel_;
  size_t keep_;
  IsolateResult r_;
  Stream streams_[2];
  Clock::time_point start_;
  pid_t pid_ = -1;
  bool lost_ = false;
};

}  // namespace

IsolateResult run_isolated(const IsolateOptions& options,
                           const std::function<bool()>& should_cancel) {
  if (options.argv.empty() || options.argv[0].empty()) {
    throw std::invalid_argument("run_isolated: argv is empty; give the program and its arguments");
  }
  return Runner(options, should_cancel).run();
}

#else

IsolateResult run_isolated(const IsolateOptions&, const std::function<bool()>&) {
  throw std::runtime_error(
      "run_isolated needs Linux (fork, process groups, /proc, prctl); this build is for another "
      "system: run candidates in-process instead");
}

#endif

}  // namespace honed
