// cpp/include/honed/isolate.h: run a job in a worker process: timeout, memory cap, crashes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace honed {

// What to run and the limits it runs under.
//   argv        program and arguments; a program name without '/' is looked up on PATH (the
//               PATH of env when env sets one, else this process's)
//   env         variables set or overridden in the child; the rest of this process's
//               environment is inherited
//   cwd         working directory of the child ("" = this process's)
//   timeout_s   wall-clock limit (0 = none)
//   memory_limit_bytes  ceiling on the resident memory of the child's process group (0 = none)
//   tail_bytes  how much of the end of stdout and of stderr is kept
//   poll_ms     how often the timeout, the memory and should_cancel are checked
//   kill_grace_s  after SIGTERM (timeout, cancel), how long the group has before SIGKILL
struct IsolateOptions {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::string cwd;
  double timeout_s = 0;
  int64_t memory_limit_bytes = 0;
  size_t tail_bytes = 8192;
  double poll_ms = 20;
  double kill_grace_s = 0.5;
};

// How the job ended. exit_code is the exit status when it exited (signal = 0), -1 when a signal
// ended it (signal = that signal). timed_out / cancelled / memory_exceeded say that run_isolated
// killed it and why. start_error is non-empty when the program could not be started (not found,
// not executable, bad cwd): then exit_code = 127 and stderr_tail holds the same reason.
// peak_rss_bytes is the largest resident set seen (see run_isolated), at least the kernel's
// ru_maxrss of the child.
struct IsolateResult {
  int exit_code = 0;
  int signal = 0;
  bool timed_out = false;
  bool cancelled = false;
  bool memory_exceeded = false;
  double wall_s = 0;
  int64_t peak_rss_bytes = 0;
  std::string stdout_tail;
  std::string stderr_tail;
  std::string start_error;
  // Copies of the limits, so summary() can name them.
  double timeout_s = 0;
  int64_t memory_limit_bytes = 0;

  bool ok() const;
  // One line for users: "ok", "exited with status 3", "crashed: segmentation fault (SIGSEGV)",
  // "killed after the 30 s timeout", "out of memory: resident memory passed the 2.0 GiB ceiling",
  // "killed by SIGKILL (often the kernel's out-of-memory killer)", "cancelled",
  // "could not start: ...".
  std::string summary() const;
};

// Runs argv in a child process (fork + exec) and waits for it.
// - The child leads its own process group, so a terminal's Ctrl-C reaches only this process,
//   and it has PR_SET_PDEATHSIG = SIGKILL: it dies when the thread that started it dies (the
//   call blocks that thread until the child is reaped). stdin is /dev/null; every signal
//   disposition is reset to the default (Python ignores SIGPIPE, which exec would inherit).
// - stdout and stderr go through pipes read with poll(), keeping only the last tail_bytes each.
// - Every poll_ms: the timeout, the memory of the group and should_cancel() are checked.
//   Memory is the sum of resident pages (/proc/<pid>/statm) of every process whose process
//   group is the child's: the child and the descendants that stay in its group, including
//   orphans reparented away from it. A descendant that calls setsid/setpgid leaves the
//   measurement, not the kill: the child's environment carries a marker (HONED_WORKER_TREE=...)
//   every descendant inherits, and once the child has been reaped every process still holding
//   it is SIGKILLed. The child is a child subreaper (PR_SET_CHILD_SUBREAPER), so orphans of its
//   tree stay below it while it lives.
// - Timeout or cancel: SIGTERM to the group, up to kill_grace_s for the child to exit, then
//   SIGKILL to the group. Memory ceiling: SIGKILL to the group at once (it may still be growing).
//   When the child exits on its own, whatever it left running in its group is SIGKILLed too.
//   The group is always signalled before the child is reaped, so its id cannot have been reused.
// - If should_cancel throws, the group is killed and reaped and the exception propagates.
// Failures to start the program are a result (start_error, exit 127), not an exception;
// an empty argv throws std::invalid_argument, a failing pipe/fork std::system_error.
// Linux only: elsewhere it throws std::runtime_error.
IsolateResult run_isolated(const IsolateOptions& options,
                           const std::function<bool()>& should_cancel = {});

// "2.0 GiB", "100 MiB", "512 bytes": the unit used in summaries.
std::string format_bytes(int64_t bytes);

// "segmentation fault (SIGSEGV)", "aborted (SIGABRT)", "signal 42" for others.
std::string describe_signal(int signal);

// "SIGTERM", "signal 42" for others.
std::string signal_name(int signal);

}  // namespace honed
