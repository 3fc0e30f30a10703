// cpp/src/process.cpp: starting a child (vfork-style clone + exec), draining its pipes, /proc,
// ending its tree.
#include "process.h"

#ifdef __linux__
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>

extern char** environ;

namespace honed::detail {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

namespace {

// Written by the child to the status pipe when it cannot exec; the pipe closes on exec.
struct StartFailure {
  int stage;  // 0 = chdir, 1 = exec
  int error;
};

// The child's channel socket lands on this fd number.
constexpr int kChannelFd = 3;
// Parent-side fds are moved at least this high, so the child's dup2 onto 0..3 clobbers none.
constexpr int kLowestFd = 10;

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

std::string new_marker() {
  static std::atomic<unsigned> counter{0};
  return "HONED_WORKER_TREE=" + std::to_string(getpid()) + "-" + std::to_string(++counter);
}

[[noreturn]] void child_fail(int status_fd, int stage) {
  const StartFailure f{stage, errno};
  [[maybe_unused]] ssize_t n = write(status_fd, &f, sizeof f);
  _exit(127);
}

// Runs in the child, which shares the parent's memory until it execs (start_child): async-signal-
// safe calls only, nothing written outside its own stack but errno.
[[noreturn]] void child_main(const ChildPlan& plan, int out_fd, int err_fd, int channel_fd,
                             int status_fd, pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  prctl(PR_SET_CHILD_SUBREAPER, 1);     // kept across exec: orphans of the tree stay below it
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
  int first_closed = 3;
  if (channel_fd >= 0) {
    dup2(channel_fd, kChannelFd);  // dup2 clears close-on-exec on the copy
    first_closed = kChannelFd + 1;
  }
#ifdef SYS_close_range
  // Everything above stays closed in the program; status_fd stays open until exec.
  syscall(SYS_close_range, static_cast<unsigned>(first_closed), ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
#endif
  if (!plan.cwd.empty() && chdir(plan.cwd.c_str()) != 0) child_fail(status_fd, 0);
  execve(plan.path.c_str(), plan.argv_ptrs.data(), plan.env_ptrs.data());
  child_fail(status_fd, 1);
}

struct ChildArgs {
  const ChildPlan* plan;
  int out_fd, err_fd, channel_fd, status_fd;
  pid_t parent;
};

int child_entry(void* p) {
  const auto* a = static_cast<const ChildArgs*>(p);
  child_main(*a->plan, a->out_fd, a->err_fd, a->channel_fd, a->status_fd, a->parent);
}

// The child's own stack while it shares the parent's memory, with a guard page below it.
constexpr std::size_t kChildStack = 256 * 1024;
constexpr std::size_t kGuard = 4096;

// Starts the child as posix_spawn does: clone(CLONE_VM | CLONE_VFORK) runs it in the parent's
// memory, on a stack of its own, the parent suspended until it execs or exits. fork() would copy
// the parent's page tables first, which for a program holding a model and a CUDA context takes
// long enough to stall its other threads (the page-table lock) while a worker starts.
// posix_spawn itself cannot be used: the child must set PR_SET_PDEATHSIG and become a child
// subreaper before it execs, which no spawn attribute does. Every signal stays blocked across
// the clone, so no handler of the parent's runs in the child before child_main resets them.
pid_t spawn_child(const ChildArgs& args) {
  void* mem = mmap(nullptr, kChildStack + kGuard, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (mem == MAP_FAILED) return -1;
  mprotect(mem, kGuard, PROT_NONE);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  char* top = static_cast<char*>(mem) + kGuard + kChildStack;  // stacks grow down
  const pid_t pid =
      clone(child_entry, top, CLONE_VM | CLONE_VFORK | SIGCHLD, const_cast<ChildArgs*>(&args));
  const int e = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  munmap(mem, kChildStack + kGuard);  // the child has exec'd or exited: CLONE_VFORK
  errno = e;
  return pid;
}

int lifted(int fd) {
  if (fd >= kLowestFd) return fd;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, kLowestFd);
  close(fd);
  if (moved < 0) throw_errno("run_isolated: fcntl");
  return moved;
}

void make_pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) throw_errno("run_isolated: pipe");
  fds[0] = lifted(fds[0]);
  fds[1] = lifted(fds[1]);
}

void make_socketpair(int fds[2]) {
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw_errno("Worker: socketpair");
  }
  fds[0] = lifted(fds[0]);
  fds[1] = lifted(fds[1]);
}

std::optional<StartFailure> read_start_failure(int fd) {
  StartFailure f{};
  ssize_t n;
  do {
    n = read(fd, &f, sizeof f);
  } while (n < 0 && errno == EINTR);
  close(fd);
  if (n == static_cast<ssize_t>(sizeof f)) return f;
  return std::nullopt;
}

std::string describe_start_failure(const ChildPlan& plan, const StartFailure& f) {
  if (f.stage == 0) {
    return "cannot change to directory '" + plan.cwd + "': " + std::strerror(f.error);
  }
  return "cannot run '" + plan.path + "': " + std::strerror(f.error);
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

// One line of /proc/<pid>/stat: the fields we use.
struct ProcStat {
  pid_t pid = 0;
  char state = '?';
  pid_t ppid = 0;
  pid_t pgrp = 0;
  int64_t rss_pages = 0;
};

std::optional<ProcStat> read_stat(pid_t pid) {
  char buf[1024];
  if (!read_small("/proc/" + std::to_string(pid) + "/stat", buf, sizeof buf)) return std::nullopt;
  const char* close_paren = std::strrchr(buf, ')');  // comm may hold spaces and parentheses
  ProcStat s;
  s.pid = pid;
  long long rss = 0;
  // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime
  // cstime priority nice threads itrealvalue starttime vsize rss
  if (!close_paren || std::sscanf(close_paren + 1,
                                  " %c %d %d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d "
                                  "%*d %*d %*d %*u %*u %lld",
                                  &s.state, &s.ppid, &s.pgrp, &rss) != 4) {
    return std::nullopt;
  }
  s.rss_pages = rss;
  return s;
}

template <typename F>
void for_each_process(F&& f) {
  DIR* dir = opendir("/proc");
  if (!dir) return;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    f(static_cast<pid_t>(pid));
  }
  closedir(dir);
}

std::vector<ProcStat> all_processes() {
  std::vector<ProcStat> out;
  for_each_process([&](pid_t pid) {
    if (auto s = read_stat(pid)) out.push_back(*s);
  });
  return out;
}

// pid's live descendants, found by parent links (zombies have ended: they are left out).
std::set<pid_t> descendants_in(const std::vector<ProcStat>& procs, pid_t root) {
  std::multimap<pid_t, pid_t> children;
  for (const ProcStat& p : procs) {
    if (p.state != 'Z') children.emplace(p.ppid, p.pid);
  }
  std::set<pid_t> found;
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    const auto [lo, hi] = children.equal_range(p);
    for (auto it = lo; it != hi; ++it) {
      if (found.insert(it->second).second) todo.push_back(it->second);
    }
  }
  return found;
}

bool environ_holds(pid_t pid, const std::string& marker) {
  const int fd = open(("/proc/" + std::to_string(pid) + "/environ").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string data;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) data.append(buf, static_cast<size_t>(n));
  close(fd);
  size_t begin = 0;
  while (begin < data.size()) {
    size_t end = data.find('\0', begin);
    if (end == std::string::npos) end = data.size();
    if (data.compare(begin, end - begin, marker) == 0) return true;
    begin = end + 1;
  }
  return false;
}

}  // namespace

ChildPlan make_plan(const IsolateOptions& o) {
  ChildPlan plan;
  plan.argv = o.argv;
  plan.env = child_environment(o.env);
  plan.marker = new_marker();
  plan.env.push_back(plan.marker);
  plan.cwd = o.cwd;
  plan.path = resolve_program(o.argv[0], lookup_path(plan.env));
  for (std::string& a : plan.argv) plan.argv_ptrs.push_back(a.data());
  plan.argv_ptrs.push_back(nullptr);
  for (std::string& e : plan.env) plan.env_ptrs.push_back(e.data());
  plan.env_ptrs.push_back(nullptr);
  return plan;
}

Started start_child(const ChildPlan& plan, bool with_channel) {
  Started s;
  if (plan.path.empty()) {
    s.start_error = "'" + plan.argv[0] + "' was not found on PATH; give its full path";
    return s;
  }
  int out[2], err[2], status[2], chan[2] = {-1, -1};
  make_pipe(out);
  make_pipe(err);
  make_pipe(status);
  if (with_channel) make_socketpair(chan);
  const pid_t parent = getpid();
  const ChildArgs args{&plan, out[1], err[1], chan[1], status[1], parent};
  const pid_t pid = spawn_child(args);
  if (pid < 0) {
    const int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1], status[0], status[1], chan[0], chan[1]}) {
      if (fd >= 0) close(fd);
    }
    errno = e;
    throw_errno("run_isolated: clone");
  }
  setpgid(pid, pid);  // also done by the child; whichever runs first makes the group
  close(out[1]);
  close(err[1]);
  close(status[1]);
  if (chan[1] >= 0) close(chan[1]);
  s.pid = pid;
  s.out = out[0];
  s.err = err[0];
  s.channel = chan[0];
  fcntl(s.out, F_SETFL, O_NONBLOCK);
  fcntl(s.err, F_SETFL, O_NONBLOCK);
  if (s.channel >= 0) fcntl(s.channel, F_SETFL, O_NONBLOCK);
  if (const auto failure = read_start_failure(status[0])) {
    int ignored = 0;
    while (waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
    }
    for (int fd : {s.out, s.err, s.channel}) {
      if (fd >= 0) close(fd);
    }
    Started failed;
    failed.start_error = describe_start_failure(plan, *failure);
    return failed;
  }
  return s;
}

void drain(int& fd, std::string& tail, size_t keep) {
  char buf[65536];
  while (fd >= 0) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      tail.append(buf, static_cast<size_t>(n));
      if (tail.size() > keep) tail.erase(0, tail.size() - keep);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close(fd);  // EOF (or an error: nothing more will come)
    fd = -1;
  }
}

void drain(Stream& s, size_t keep) { drain(s.fd, s.tail, keep); }

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

int64_t resident_bytes(pid_t pid) {
  static const int64_t page = sysconf(_SC_PAGESIZE);
  char buf[256];
  if (!read_small("/proc/" + std::to_string(pid) + "/statm", buf, sizeof buf)) return 0;
  long long size = 0, resident = 0;
  if (std::sscanf(buf, "%lld %lld", &size, &resident) != 2) return 0;
  return resident * page;
}

int64_t group_resident_bytes(pid_t pgid) {
  static const int64_t page = sysconf(_SC_PAGESIZE);
  int64_t total = 0;
  bool seen = false;
  for_each_process([&](pid_t pid) {
    const auto s = read_stat(pid);
    if (s && (pid == pgid || s->pgrp == pgid)) {
      total += s->rss_pages * page;
      seen = true;
    }
  });
  return seen ? total : resident_bytes(pgid);
}

int64_t tree_resident_bytes(pid_t root) {
  static const int64_t page = sysconf(_SC_PAGESIZE);
  const std::vector<ProcStat> procs = all_processes();
  const std::set<pid_t> below = descendants_in(procs, root);
  int64_t total = 0;
  for (const ProcStat& p : procs) {
    if (p.pid == root || p.pgrp == root || below.count(p.pid)) total += p.rss_pages * page;
  }
  return total;
}

void kill_descendants(pid_t root) {
  for (int round = 0; round < 50; ++round) {
    const std::set<pid_t> below = descendants_in(all_processes(), root);
    if (below.empty()) return;
    for (pid_t p : below) kill(p, SIGKILL);
    // The killed become zombies of their parents (or of root, which adopts orphans): give
    // root a moment to see them go before looking again.
    usleep(2000);
  }
}

void signal_descendants(pid_t root, int signal) {
  for (pid_t p : descendants_in(all_processes(), root)) kill(p, signal);
}

void kill_marked(const std::string& marker) {
  if (marker.empty()) return;
  const pid_t self = getpid();
  for (int round = 0; round < 50; ++round) {
    std::vector<pid_t> marked;
    for_each_process([&](pid_t pid) {
      if (pid != self && environ_holds(pid, marker)) marked.push_back(pid);
    });
    if (marked.empty()) return;
    for (pid_t p : marked) kill(p, SIGKILL);
    usleep(2000);
  }
}

void reap_into(pid_t pid, bool lost, Clock::time_point started, IsolateResult& r) {
  if (!lost) kill(-pid, SIGKILL);
  int status = 0;
  rusage usage{};
  pid_t got;
  do {
    got = wait4(pid, &status, 0, &usage);
  } while (got < 0 && errno == EINTR);
  r.wall_s = seconds_since(started);
  if (got != pid) {  // reaped elsewhere: the status is unknown
    r.exit_code = -1;
    return;
  }
  r.peak_rss_bytes = std::max(r.peak_rss_bytes, static_cast<int64_t>(usage.ru_maxrss) * 1024);
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.exit_code = -1;
    r.signal = WTERMSIG(status);
  }
}

}  // namespace honed::detail
#endif
