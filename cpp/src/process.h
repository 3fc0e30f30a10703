// cpp/src/process.h: what run_isolated and Worker share: start a child, pipes, /proc, tree end.
#pragma once
#ifdef __linux__
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "honed/isolate.h"

namespace honed::detail {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0);

[[noreturn]] void throw_errno(const std::string& what);

// What the child needs, built before it starts: until it execs, the child runs in the parent's
// memory (start_child) and makes only async-signal-safe calls.
// `marker` (NAME=VALUE) is put in the child's environment: every descendant inherits it, so the
// tree can be found and ended even after a process has left the group (setsid) or been
// reparented.
struct ChildPlan {
  std::string path;
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string cwd;
  std::string marker;
  std::vector<char*> argv_ptrs;
  std::vector<char*> env_ptrs;
};

ChildPlan make_plan(const IsolateOptions& options);

// A started child: its pid, the parent's ends of its stdout and stderr, and of its channel (a
// socket the child sees as fd 3) when one was asked for. start_error is set (pid = -1) when it
// could not be started.
struct Started {
  pid_t pid = -1;
  int out = -1;
  int err = -1;
  int channel = -1;
  std::string start_error;
};

// clone (vfork-style) + exec: the child leads its own process group, is a child subreaper (orphans
// of its tree stay below it), dies with the starting thread (PR_SET_PDEATHSIG), has default signal
// dispositions, stdin on /dev/null. Its stdout/stderr fds are non-blocking here.
Started start_child(const ChildPlan& plan, bool with_channel);

// A pipe's read end with the kept tail of what came through it.
struct Stream {
  int fd = -1;
  std::string tail;
};

// Reads what is there (non-blocking fd), keeping the last `keep` bytes; closes the fd at EOF
// (and sets it to -1).
void drain(int& fd, std::string& tail, size_t keep);
void drain(Stream& s, size_t keep);

// Whether the child has exited, without reaping it (its pid, the group id, stays reserved).
// `lost` is set when it was reaped elsewhere (SIGCHLD ignored): then its status is unknown.
bool child_exited(pid_t pid, bool& lost);

// Resident bytes of one process (/proc/<pid>/statm).
int64_t resident_bytes(pid_t pid);

// Resident bytes of every process in group pgid.
int64_t group_resident_bytes(pid_t pgid);

// Resident bytes of pid, every process in its group and every process descended from it.
int64_t tree_resident_bytes(pid_t pid);

// SIGKILLs every process descended from pid (not pid itself), round after round until none is
// left: while pid lives, as a subreaper it adopts the orphans of each round.
void kill_descendants(pid_t pid);

// Sends `signal` to every process descended from pid (not pid itself), once.
void signal_descendants(pid_t pid, int signal);

// SIGKILLs every process of this user whose environment holds `marker`, until none is left.
void kill_marked(const std::string& marker);

// Reaps pid (after SIGKILL to its group unless lost) and fills exit_code/signal/wall_s/peak.
void reap_into(pid_t pid, bool lost, Clock::time_point started, IsolateResult& r);

}  // namespace honed::detail
#endif
