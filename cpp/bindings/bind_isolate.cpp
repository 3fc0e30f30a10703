// cpp/bindings/bind_isolate.cpp: honed._core bindings of isolate and worker (run_isolated, Worker).
#include <Python.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "bindings.h"
#include "honed/isolate.h"
#include "honed/worker.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace honed::py {

namespace {

void bind_options(nb::module_& m) {
  using O = IsolateOptions;
  const O d;
  nb::class_<O>(m, "IsolateOptions")
      .def(
          "__init__",
          [](O* self, std::vector<std::string> argv,
             std::vector<std::pair<std::string, std::string>> env, std::string cwd,
             double timeout_s, int64_t memory_limit_bytes, size_t tail_bytes, double poll_ms,
             double kill_grace_s) {
            new (self) O{std::move(argv),    std::move(env), std::move(cwd), timeout_s,
                         memory_limit_bytes, tail_bytes,     poll_ms,        kill_grace_s};
          },
          "argv"_a, nb::kw_only(), "env"_a = d.env, "cwd"_a = d.cwd, "timeout_s"_a = d.timeout_s,
          "memory_limit_bytes"_a = d.memory_limit_bytes, "tail_bytes"_a = d.tail_bytes,
          "poll_ms"_a = d.poll_ms, "kill_grace_s"_a = d.kill_grace_s)
      .def_rw("argv", &O::argv)
      .def_rw("env", &O::env)
      .def_rw("cwd", &O::cwd)
      .def_rw("timeout_s", &O::timeout_s)
      .def_rw("memory_limit_bytes", &O::memory_limit_bytes)
      .def_rw("tail_bytes", &O::tail_bytes)
      .def_rw("poll_ms", &O::poll_ms)
      .def_rw("kill_grace_s", &O::kill_grace_s);
}

void bind_result(nb::module_& m) {
  using R = IsolateResult;
  nb::class_<R>(m, "IsolateResult")
      .def_ro("exit_code", &R::exit_code)
      .def_ro("signal", &R::signal)
      .def_ro("timed_out", &R::timed_out)
      .def_ro("cancelled", &R::cancelled)
      .def_ro("memory_exceeded", &R::memory_exceeded)
      .def_ro("wall_s", &R::wall_s)
      .def_ro("peak_rss_bytes", &R::peak_rss_bytes)
      .def_ro("stdout_tail", &R::stdout_tail)
      .def_ro("stderr_tail", &R::stderr_tail)
      .def_ro("start_error", &R::start_error)
      .def_prop_ro("ok", &R::ok)
      .def("summary", &R::summary)
      .def("__repr__", [](const R& r) { return "IsolateResult(" + r.summary() + ")"; });
}

// Runs with the GIL released. With check_signals, every poll the callback takes the GIL and
// runs Python's signal handlers; when one raises (Ctrl-C: KeyboardInterrupt) the group is killed
// and reaped, and that exception is raised here.
IsolateResult run(const IsolateOptions& options, bool check_signals) {
  std::unique_ptr<nb::python_error> raised;
  std::function<bool()> should_cancel;
  if (check_signals) {
    should_cancel = [&raised]() {
      nb::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() == 0) return false;
      raised = std::make_unique<nb::python_error>();  // takes the error out of the interpreter
      return true;
    };
  }
  IsolateResult result;
  {
    nb::gil_scoped_release no_gil;
    result = run_isolated(options, should_cancel);
  }
  if (raised) throw nb::python_error(*raised);
  return result;
}

const char* kind_name(WorkerEvent::Kind kind) {
  switch (kind) {
    case WorkerEvent::Kind::message:
      return "message";
    case WorkerEvent::Kind::sent:
      return "sent";
    case WorkerEvent::Kind::timed_out:
      return "timed_out";
    case WorkerEvent::Kind::ended:
      return "ended";
    case WorkerEvent::Kind::cancelled:
      return "cancelled";
  }
  return "unknown";
}

// A contiguous Python buffer (bytes, memoryview, PickleBuffer), held open for reading; made and
// dropped with the GIL, read without it.
class BufferView {
 public:
  explicit BufferView(nb::handle object) {
    if (PyObject_GetBuffer(object.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) throw nb::python_error();
  }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  BufferView(BufferView&& other) noexcept : view_(other.view_) { other.view_.obj = nullptr; }
  BufferView& operator=(BufferView&&) = delete;
  ~BufferView() {
    if (view_.obj != nullptr) PyBuffer_Release(&view_);
  }
  const char* data() const { return static_cast<const char*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

// The calls that wait run with the GIL released; messages cross as bytes (or buffers).
void bind_worker(nb::module_& m) {
  nb::class_<WorkerEvent>(m, "WorkerEvent")
      .def_prop_ro("kind", [](const WorkerEvent& e) { return kind_name(e.kind); })
      .def_prop_ro(
          "message",
          [](const WorkerEvent& e) { return nb::bytes(e.message.data(), e.message.size()); })
      .def_ro("ended", &WorkerEvent::ended)
      .def("__repr__", [](const WorkerEvent& e) {
        return std::string("WorkerEvent(") + kind_name(e.kind) + ")";
      });
  nb::class_<Worker>(m, "Worker")
      .def(nb::init<IsolateOptions>(), "options"_a, release_gil())
      .def_prop_ro("pid", &Worker::pid)
      .def_prop_ro("running", &Worker::running)
      .def_prop_ro("start_error", &Worker::start_error)
      .def(
          "send",
          [](Worker& w, nb::handle message, double timeout_s) {
            // One message from its parts (a pickle, then the buffers it left out of band: a CPU
            // model's weights, hundreds of MB): the parts are joined without the GIL, while
            // the buffer views keep them alive and unchanged.
            std::vector<BufferView> parts;
            if (PyList_Check(message.ptr())) {
              for (nb::handle part : nb::borrow<nb::list>(message)) parts.emplace_back(part);
            } else {
              parts.emplace_back(message);
            }
            nb::gil_scoped_release no_gil;
            size_t size = 0;
            for (const BufferView& part : parts) size += part.size();
            std::string data;
            data.reserve(size);
            for (const BufferView& part : parts) data.append(part.data(), part.size());
            return w.send(data, timeout_s);
          },
          "message"_a, "timeout_s"_a = -1.0)
      .def("receive", &Worker::receive, "timeout_s"_a = -1.0, release_gil())
      .def("cancel", &Worker::cancel)
      .def("pause", &Worker::pause, release_gil())
      .def("resume", &Worker::resume, release_gil())
      .def("stop", &Worker::stop, "grace_s"_a = 0.0, release_gil())
      .def("take_output", &Worker::take_output)
      .def("resident_bytes", &Worker::resident_bytes, release_gil())
      .def_prop_ro("peak_rss_bytes", &Worker::peak_rss_bytes);
}

}  // namespace

void bind_isolate(nb::module_& m) {
  bind_options(m);
  bind_result(m);
  bind_worker(m);
  m.def("run_isolated", &run, "options"_a, "check_signals"_a = true);
  m.def("format_bytes", &format_bytes, "bytes"_a);
  m.def("describe_signal", &describe_signal, "signal"_a);
}

}  // namespace honed::py
