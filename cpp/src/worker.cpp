// cpp/src/worker.cpp: Worker: a long-lived child, messages over a socket, run_isolated's limits.
#include "honed/worker.h"

#include <stdexcept>

#ifdef __linux__
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "process.h"
#endif

namespace honed {

#ifdef __linux__

namespace {

constexpr size_t kHeader = 8;  // little-endian message length

std::string framed(const std::string& message) {
  std::string out(kHeader, '\0');
  const uint64_t n = message.size();
  for (size_t i = 0; i < kHeader; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += message;
  return out;
}

uint64_t declared_length(const std::string& buf) {
  uint64_t n = 0;
  for (size_t i = 0; i < kHeader; ++i) {
    n |= static_cast<uint64_t>(static_cast<unsigned char>(buf[i])) << (8 * i);
  }
  return n;
}

using Clock = std::chrono::steady_clock;

int ms_until(Clock::time_point t) {
  const double ms = std::chrono::duration<double, std::milli>(t - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min(ms + 1.0, 1e9));
}

Clock::time_point after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void close_fd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Reads what the socket holds into inbox; closes it at EOF or on an error.
void read_channel(int& fd, std::string& inbox) {
  char buf[65536];
  while (fd >= 0) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      inbox.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close_fd(fd);
  }
}

// Writes as much of data as the socket takes; closes it when the peer is gone.
void write_channel(int& fd, const std::string& data, size_t& written) {
  while (fd >= 0 && written < data.size()) {
    const ssize_t n =
        ::send(fd, data.data() + written, data.size() - written, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      written += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close_fd(fd);
  }
}

}  // namespace

Worker::Worker(IsolateOptions options) : options_(std::move(options)) {
  if (options_.argv.empty() || options_.argv[0].empty()) {
    throw std::invalid_argument("Worker: argv is empty; give the program and its arguments");
  }
  result_.memory_limit_bytes = options_.memory_limit_bytes;
  const detail::ChildPlan plan = detail::make_plan(options_);
  marker_ = plan.marker;
  started_ = Clock::now();
  const detail::Started s = detail::start_child(plan, true);
  if (!s.start_error.empty()) {
    result_.exit_code = 127;
    result_.start_error = s.start_error;
    result_.stderr_tail = s.start_error;
    ended_ = true;
    return;
  }
  pid_ = s.pid;
  channel_ = s.channel;
  out_ = s.out;
  err_ = s.err;
}

Worker::~Worker() { stop(0.0); }

void Worker::service(int wait_ms, const std::string* out, size_t* written) {
  pollfd fds[3];
  nfds_t n = 0;
  if (channel_ >= 0) {
    const bool writing = out != nullptr && *written < out->size();
    fds[n++] = pollfd{channel_, static_cast<short>(POLLIN | (writing ? POLLOUT : 0)), 0};
  }
  if (out_ >= 0) fds[n++] = pollfd{out_, POLLIN, 0};
  if (err_ >= 0) fds[n++] = pollfd{err_, POLLIN, 0};
  if (n == 0) {
    if (wait_ms > 0) usleep(static_cast<useconds_t>(wait_ms) * 1000);
    return;
  }
  if (poll(fds, n, std::max(wait_ms, 0)) <= 0) return;  // timeout, or EINTR: the caller checks
  detail::drain(out_, out_tail_, options_.tail_bytes);
  detail::drain(err_, err_tail_, options_.tail_bytes);
  read_channel(channel_, inbox_);
  if (out != nullptr) write_channel(channel_, *out, *written);
}

bool Worker::has_message() const {
  return inbox_.size() >= kHeader && inbox_.size() - kHeader >= declared_length(inbox_);
}

std::string Worker::pop_message() {
  const auto n = static_cast<size_t>(declared_length(inbox_));
  std::string message = inbox_.substr(kHeader, n);
  inbox_.erase(0, kHeader + n);
  return message;
}

bool Worker::over(WorkerEvent& event, Clock::time_point& next_memory_check) {
  auto end_as = [&](WorkerEvent::Kind kind, double grace_s) {
    finish(grace_s);
    event.kind = kind;
    event.ended = result_;
    return true;
  };
  if (cancel_.load()) {
    result_.cancelled = true;
    return end_as(WorkerEvent::Kind::cancelled, 0.0);
  }
  if (detail::child_exited(pid_, lost_)) return end_as(WorkerEvent::Kind::ended, 0.0);
  if (options_.memory_limit_bytes > 0 && Clock::now() >= next_memory_check) {
    next_memory_check = after(std::max(options_.poll_ms, 1.0) / 1000.0);
    const int64_t rss = detail::tree_resident_bytes(pid_);
    result_.peak_rss_bytes = std::max(result_.peak_rss_bytes, rss);
    if (rss > options_.memory_limit_bytes) {
      result_.memory_exceeded = true;
      return end_as(WorkerEvent::Kind::ended, 0.0);
    }
  }
  // A closed socket: it can say nothing more. It is usually exiting: let it, briefly.
  if (channel_ < 0) return end_as(WorkerEvent::Kind::ended, options_.kill_grace_s);
  return false;
}

void Worker::finish(double grace_s) {
  if (ended_) return;
  const auto t0 = Clock::now();
  bool exited = detail::child_exited(pid_, lost_);
  while (!exited && detail::seconds_since(t0) < grace_s) {
    service(10, nullptr, nullptr);
    exited = detail::child_exited(pid_, lost_);
  }
  if (!exited) detail::kill_descendants(pid_);  // while it lives it adopts orphans: all found
  {
    // From here on no pause()/resume() from another thread may signal: the pid is reaped next.
    const std::lock_guard<std::mutex> lock(signal_mutex_);
    ended_ = true;
  }
  detail::reap_into(pid_, lost_, started_, result_);
  detail::kill_marked(marker_);  // what left the group and was reparented away
  const auto t1 = Clock::now();
  while ((out_ >= 0 || err_ >= 0 || channel_ >= 0) && detail::seconds_since(t1) < 1.0) {
    service(20, nullptr, nullptr);
  }
  close_fd(channel_);
  close_fd(out_);
  close_fd(err_);
  result_.stdout_tail = out_tail_;  // the end of the output is often why it ended
  result_.stderr_tail = err_tail_;
}

WorkerEvent Worker::send(const std::string& message, double timeout_s) {
  WorkerEvent event;
  if (ended_) {
    event.kind = WorkerEvent::Kind::ended;
    event.ended = result_;
    return event;
  }
  const std::string data = framed(message);
  size_t written = 0;
  const auto deadline = timeout_s < 0 ? Clock::time_point::max() : after(timeout_s);
  auto next_memory_check = Clock::now();
  const int poll_ms = static_cast<int>(std::max(options_.poll_ms, 1.0));
  while (true) {
    service(std::min(poll_ms, ms_until(deadline)), &data, &written);
    if (written == data.size()) {
      event.kind = WorkerEvent::Kind::sent;
      return event;
    }
    if (over(event, next_memory_check)) return event;
    if (Clock::now() >= deadline) {
      event.kind = WorkerEvent::Kind::timed_out;
      return event;
    }
  }
}

WorkerEvent Worker::receive(double timeout_s) {
  WorkerEvent event;
  if (has_message()) {
    event.kind = WorkerEvent::Kind::message;
    event.message = pop_message();
    return event;
  }
  if (ended_) {
    event.kind = WorkerEvent::Kind::ended;
    event.ended = result_;
    return event;
  }
  const auto deadline = timeout_s < 0 ? Clock::time_point::max() : after(timeout_s);
  auto next_memory_check = Clock::now();
  const int poll_ms = static_cast<int>(std::max(options_.poll_ms, 1.0));
  while (true) {
    service(std::min(poll_ms, ms_until(deadline)), nullptr, nullptr);
    if (has_message()) {
      event.kind = WorkerEvent::Kind::message;
      event.message = pop_message();
      return event;
    }
    if (over(event, next_memory_check)) {
      if (event.kind == WorkerEvent::Kind::ended && has_message()) {
        // A whole message came just before the end: it goes first, the next call says how
        // the worker ended.
        event.kind = WorkerEvent::Kind::message;
        event.message = pop_message();
      }
      return event;
    }
    if (Clock::now() >= deadline) {
      event.kind = WorkerEvent::Kind::timed_out;
      return event;
    }
  }
}

IsolateResult Worker::stop(double grace_s) {
  if (!ended_) {
    if (channel_ >= 0) shutdown(channel_, SHUT_WR);  // the worker reads EOF: time to go
    finish(grace_s);
  }
  return result_;
}

std::pair<std::string, std::string> Worker::take_output() {
  std::pair<std::string, std::string> out{std::move(out_tail_), std::move(err_tail_)};
  out_tail_.clear();
  err_tail_.clear();
  return out;
}

int64_t Worker::resident_bytes() const { return ended_ ? 0 : detail::tree_resident_bytes(pid_); }

void Worker::signal_tree(int signal) {
  const std::lock_guard<std::mutex> lock(signal_mutex_);
  if (ended_ || pid_ <= 0) return;
  kill(-pid_, signal);
  detail::signal_descendants(pid_, signal);
}

#else

Worker::Worker(IsolateOptions options) : options_(std::move(options)) {
  throw std::runtime_error(
      "Worker needs Linux (fork, process groups, /proc, prctl); this build is for another "
      "system: run candidates in-process instead");
}
Worker::~Worker() = default;
void Worker::service(int, const std::string*, size_t*) {}
bool Worker::has_message() const { return false; }
std::string Worker::pop_message() { return {}; }
bool Worker::over(WorkerEvent&, Clock::time_point&) { return true; }
void Worker::finish(double) {}
WorkerEvent Worker::send(const std::string&, double) { return {}; }
WorkerEvent Worker::receive(double) { return {}; }
IsolateResult Worker::stop(double) { return result_; }
void Worker::signal_tree(int) {}
std::pair<std::string, std::string> Worker::take_output() { return {}; }
int64_t Worker::resident_bytes() const { return 0; }

#endif

}  // namespace honed
