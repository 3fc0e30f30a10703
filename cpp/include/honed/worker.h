// cpp/include/honed/worker.h: a long-lived worker process: messages over a socket, with limits.
#pragma once
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include "honed/isolate.h"

namespace honed {

// What send() and receive() came back with.
//   message    receive(): one whole message from the worker (in `message`)
//   sent       send(): the whole message was written
//   timed_out  nothing came (receive) or could be written (send) in time; the worker still runs
//   ended      the worker ended (crash, exit, memory ceiling, closed its socket) and is reaped;
//              `ended` says how
//   cancelled  cancel() was called: the worker and its tree were ended; `ended` says how
struct WorkerEvent {
  enum class Kind { message, sent, timed_out, ended, cancelled };
  Kind kind = Kind::timed_out;
  std::string message;
  IsolateResult ended;
};

// A worker process started once and given many jobs, the way torch's autotune_process runs
// its benchmark children: the child reads requests from fd 3 (one end of a Unix socket) and
// writes replies to the same fd, each message an 8-byte little-endian length and the bytes.
//
// The child is started like run_isolated's (own process group, PR_SET_PDEATHSIG, default
// signal dispositions, stdin on /dev/null, the tree marker in its environment) and watched
// while send() and receive() wait: the memory of its tree (the child, its group and every
// process below it) against options.memory_limit_bytes (SIGKILL to the whole tree at once),
// its exit, and cancel(). stdout and stderr are read as they come; take_output() hands over
// what was kept since the last call. options.timeout_s is not used: each call has its own.
//
// One thread drives a Worker (send, receive, stop); cancel() may come from any thread. The
// child dies with the thread that constructed the Worker (PR_SET_PDEATHSIG): construct it on
// a thread that lives as long as the worker should.
class Worker {
 public:
  explicit Worker(IsolateOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // -1 when it could not start (start_error() says why) or once it has ended.
  pid_t pid() const { return ended_ ? -1 : pid_; }
  bool running() const { return !ended_; }
  const std::string& start_error() const { return result_.start_error; }

  WorkerEvent send(const std::string& message, double timeout_s);
  WorkerEvent receive(double timeout_s);

  // Makes the send() or receive() in progress (or the next one) end the worker and return
  // `cancelled`. Safe from any thread.
  void cancel() { cancel_.store(true); }

  // SIGSTOP / SIGCONT to the worker's tree (its group and every process below it), e.g. to keep
  // its build off the cores while another worker measures. Safe from any thread; nothing once
  // it has ended.
  void pause() { signal_tree(SIGSTOP); }
  void resume() { signal_tree(SIGCONT); }

  // Ends the worker: up to grace_s for it to exit by itself (after its socket is closed, a
  // well-behaved worker does), then SIGKILL to every process of its tree (those that left the
  // group with setsid included). Returns how it ended; later calls return the same.
  IsolateResult stop(double grace_s);

  // (stdout, stderr) kept since the last call, the last tail_bytes of each.
  std::pair<std::string, std::string> take_output();

  // Resident bytes of the tree now, and the largest seen while watching.
  int64_t resident_bytes() const;
  int64_t peak_rss_bytes() const { return result_.peak_rss_bytes; }

 private:
  using Clock = std::chrono::steady_clock;

  void service(int wait_ms, const std::string* out, size_t* written);
  bool has_message() const;
  std::string pop_message();
  // Checks exit, memory and cancel; fills `event` and returns true when the worker is over.
  bool over(WorkerEvent& event, Clock::time_point& next_memory_check);
  void finish(double grace_s);
  void signal_tree(int signal);

  IsolateOptions options_;
  std::string marker_;
  pid_t pid_ = -1;
  bool lost_ = false;
  std::atomic<bool> ended_{false};
  int channel_ = -1;
  int out_ = -1;
  int err_ = -1;
  std::string out_tail_;
  std::string err_tail_;
  std::string inbox_;
  IsolateResult result_;
  Clock::time_point started_;
  std::atomic<bool> cancel_{false};
  std::mutex signal_mutex_;  // pause()/resume() against the reap
};

}  // namespace honed
