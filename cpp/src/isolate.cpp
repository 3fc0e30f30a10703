// cpp/src/isolate.cpp: run_isolated: fork + exec, pipes read with poll(), group kill, /proc memory.
#include "honed/isolate.h"

#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef __linux__
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <system_error>

extern char** environ;
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

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// What the child needs, built before fork: between fork and exec only async-signal-safe calls.
struct ChildPlan {
  std::string path;
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string cwd;
  std::vector<char*> argv_ptrs;
  std::vector<char*> env_ptrs;
};

// Written by the child to the status pipe when it cannot exec; the pipe closes on exec.
struct StartFailure {
  int stage;  // 0 = chdir, 1 = exec
  int error;
};

std::string lookup_path(const std::vector<std::string>& env) {
  for (const std::string& kv : env) {
    if (kv.rfind("PATH=", 0) == 0) return kv.substr(5);
  }
  return "/usr/local/bin:/usr/bin:/bin";
}

// Resolves a program name on PATH like execvp; "" when not found.
std::string resolve_program(const std::string& name, const std::string& path) {
  if (name.find('/') != std::string::npos) return name;
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    std::string candidate = end > begin ? path.substr(begin, end - begin) : std::string(".");
    candidate.append("/").append(name);  // not dir + "/" + name: GCC 12 warns (-Wrestrict) on it
    struct stat st{};
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    begin = end + 1;
  }
  return "";
}

std::vector<std::string> child_environment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  for (const auto& [key, value] : overrides) {
    if (key.empty() || key.find('=') != std::string::npos) {
      throw std::invalid_argument("run_isolated: environment variable name '" + key +
                                  "' is empty or contains '='; give NAME without '='");
    }
  }
  auto overridden = [&](const std::string& kv) {
    const std::string key = kv.substr(0, kv.find('='));
    return std::any_of(overrides.begin(), overrides.end(),
                       [&](const auto& o) { return o.first == key; });
  };
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    if (!overridden(*e)) env.emplace_back(*e);
  }
  for (auto it = overrides.begin(); it != overrides.end(); ++it) {
    const auto same_key = [&](const auto& o) { return o.first == it->first; };
    if (std::none_of(it + 1, overrides.end(), same_key)) {  // the last one wins
      env.push_back(it->first + "=" + it->second);
    }
  }
  return env;
}

ChildPlan make_plan(const IsolateOptions& o) {
  ChildPlan plan;
  plan.argv = o.argv;
  plan.env = child_environment(o.env);
  plan.cwd = o.cwd;
  plan.path = resolve_program(o.argv[0], lookup_path(plan.env));
  for (std::string& a : plan.argv) plan.argv_ptrs.push_back(a.data());
  plan.argv_ptrs.push_back(nullptr);
  for (std::string& e : plan.env) plan.env_ptrs.push_back(e.data());
  plan.env_ptrs.push_back(nullptr);
  return plan;
}

[[noreturn]] void child_fail(int status_fd, int stage) {
  const StartFailure f{stage, errno};
  [[maybe_unused]] ssize_t n = write(status_fd, &f, sizeof f);
  _exit(127);
}

// Runs in the forked child: async-signal-safe calls only.
[[noreturn]] void child_main(const ChildPlan& plan, int out_fd, int err_fd, int status_fd,
                             pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int s = 1; s < NSIG; ++s) {
    if (s != SIGKILL && s != SIGSTOP) sigaction(s, &dfl, nullptr);  // EINVAL for reserved ones
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  const int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, 0);
  dup2(out_fd, 1);
  dup2(err_fd, 2);
#ifdef SYS_close_range
  syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);  // status_fd stays till exec
#endif
  if (!plan.cwd.empty() && chdir(plan.cwd.c_str()) != 0) child_fail(status_fd, 0);
  execve(plan.path.c_str(), plan.argv_ptrs.data(), plan.env_ptrs.data());
  child_fail(status_fd, 1);
}

// A pipe's read end with the kept tail of what came through it.
struct Stream {
  int fd = -1;
  std::string tail;
};

// Moves fd above 0..2 so the child's dup2 onto stdin/stdout/stderr cannot clobber it.
int above_stdio(int fd) {
  if (fd > 2) return fd;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  close(fd);
  if (moved < 0) throw_errno("run_isolated: fcntl");
  return moved;
}

void make_pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) throw_errno("run_isolated: pipe");
  fds[0] = above_stdio(fds[0]);
  fds[1] = above_stdio(fds[1]);
}

void drain(Stream& s, size_t keep) {
  char buf[65536];
  while (s.fd >= 0) {
    const ssize_t n = read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.tail.append(buf, static_cast<size_t>(n));
      if (s.tail.size() > keep) s.tail.erase(0, s.tail.size() - keep);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close(s.fd);  // EOF (or an error: nothing more will come)
    s.fd = -1;
  }
}

// Waits up to wait_ms for output and reads what came.
void pump(Stream* streams, size_t count, size_t keep, int wait_ms) {
  pollfd fds[2];
  nfds_t n = 0;
  for (size_t i = 0; i < count; ++i) {
    if (streams[i].fd >= 0) fds[n++] = pollfd{streams[i].fd, POLLIN, 0};
  }
  if (poll(fds, n, std::max(wait_ms, 0)) <= 0) return;  // timeout, or EINTR: the caller checks
  for (size_t i = 0; i < count; ++i) drain(streams[i], keep);
}

// Whether the child has exited, without reaping it (so its pid, the group id, stays reserved).
// `lost` is set when it was reaped elsewhere (SIGCHLD ignored): then its status is unknown.
bool child_exited(pid_t pid, bool& lost) {
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0) {
    return info.si_pid == pid;
  }
  if (errno == ECHILD) {
    lost = true;
    return true;
  }
  return false;
}

bool read_small(const std::string& path, char* buf, size_t size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  return true;
}

int64_t resident_bytes(pid_t pid) {
  static const int64_t page = sysconf(_SC_PAGESIZE);
  char buf[256];
  if (!read_small("/proc/" + std::to_string(pid) + "/statm", buf, sizeof buf)) return 0;
  long long size = 0, resident = 0;
  if (std::sscanf(buf, "%lld %lld", &size, &resident) != 2) return 0;
  return resident * page;
}

pid_t process_group_of(pid_t pid) {
  char buf[1024];
  if (!read_small("/proc/" + std::to_string(pid) + "/stat", buf, sizeof buf)) return -1;
  const char* close_paren = std::strrchr(buf, ')');  // comm may hold spaces and parentheses
  int pgrp = -1;
  if (!close_paren || std::sscanf(close_paren + 1, " %*c %*d %d", &pgrp) != 1) return -1;
  return pgrp;
}

// Resident bytes of every process in group pgid (scans /proc).
int64_t group_resident_bytes(pid_t pgid) {
  DIR* dir = opendir("/proc");
  if (!dir) return resident_bytes(pgid);
  int64_t total = 0;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    if (pid == pgid || process_group_of(static_cast<pid_t>(pid)) == pgid) {
      total += resident_bytes(static_cast<pid_t>(pid));
    }
  }
  closedir(dir);
  return total;
}

class Runner {
 public:
  Runner(const IsolateOptions& o, const std::function<bool()>& should_cancel)
      : o_(o), should_cancel_(should_cancel), keep_(o.tail_bytes) {
    r_.timeout_s = o.timeout_s;
    r_.memory_limit_bytes = o.memory_limit_bytes;
  }

  IsolateResult run() {
    const ChildPlan plan = make_plan(o_);
    if (plan.path.empty()) {
      return start_failed("'" + o_.argv[0] + "' was not found on PATH; give its full path");
    }
    int out[2], err[2], status[2];
    make_pipe(out);
    make_pipe(err);
    make_pipe(status);
    start_ = Clock::now();
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) {
      const int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1], status[0], status[1]}) close(fd);
      errno = e;
      throw_errno("run_isolated: fork");
    }
    if (pid_ == 0) child_main(plan, out[1], err[1], status[1], parent);
    setpgid(pid_, pid_);  // also done by the child; whichever runs first makes the group
    close(out[1]);
    close(err[1]);
    close(status[1]);
    streams_[0].fd = out[0];
    streams_[1].fd = err[0];
    for (const Stream& s : streams_) fcntl(s.fd, F_SETFL, O_NONBLOCK);
    if (const auto failure = read_start_failure(status[0])) {
      reap();
      close_streams();
      return start_failed(describe_start_failure(plan, *failure));
    }
    watch();
    reap();
    finish_streams();
    return r_;
  }

 private:
  static std::optional<StartFailure> read_start_failure(int fd) {
    StartFailure f{};
    ssize_t n;
    do {
      n = read(fd, &f, sizeof f);
    } while (n < 0 && errno == EINTR);
    close(fd);
    if (n == static_cast<ssize_t>(sizeof f)) return f;
    return std::nullopt;
  }

  static std::string describe_start_failure(const ChildPlan& plan, const StartFailure& f) {
    if (f.stage == 0) {
      return "cannot change to directory '" + plan.cwd + "': " + std::strerror(f.error);
    }
    return "cannot run '" + plan.path + "': " + std::strerror(f.error);
  }

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
      if (child_exited(pid_, lost_)) return;
      const int64_t rss =
          o_.memory_limit_bytes > 0 ? group_resident_bytes(pid_) : resident_bytes(pid_);
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
    while (seconds_since(t0) < o_.kill_grace_s && !child_exited(pid_, lost_)) {
      pump(streams_, 2, keep_, 10);
    }
    if (!lost_) kill(-pid_, SIGKILL);
  }

  // Kills what the child left in its group (it is a zombie until reaped: the group id is still
  // its own), then reaps it.
  void reap() {
    if (!lost_) kill(-pid_, SIGKILL);
    int status = 0;
    rusage usage{};
    pid_t got;
    do {
      got = wait4(pid_, &status, 0, &usage);
    } while (got < 0 && errno == EINTR);
    r_.wall_s = seconds_since(start_);
    if (got != pid_) {  // reaped elsewhere: the status is unknown
      r_.exit_code = -1;
      return;
    }
    r_.peak_rss_bytes = std::max(r_.peak_rss_bytes, static_cast<int64_t>(usage.ru_maxrss) * 1024);
    if (WIFEXITED(status)) {
      r_.exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      r_.exit_code = -1;
      r_.signal = WTERMSIG(status);
    }
  }

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
