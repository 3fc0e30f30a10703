// cpp/runtime/honed_run.cpp: honed-run: load a .honed artifact in C++, check it and benchmark it.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench.h"
#include "honed/artifact.h"
#include "honed/measure.h"
#include "honed/runtime.h"
#include "honed/shapes.h"
#include "honed/version.h"

namespace {

using json = nlohmann::json;

struct Options {
  std::string artifact;
  std::string device = "cpu";
  std::string module;
  int64_t batch = 0;
  std::string shapes;
  double warmup_ms = 200;
  double duration_s = 0;
  int64_t iterations = 0;
  int threads = 1;
  std::string percentiles = "50,90,95,99";
  std::string json_file;
  bool check = false;
  double rtol = -1;  // -1: by dtype
  double atol = -1;
  bool trust_native_code = false;
  bool no_cuda_graphs = false;
  bool batch_given = false;
};

// A bad flag: main prints it as one line and exits 2.
class FlagError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename T>
bool parse_number(std::string_view text, T& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

// "50,99.9" -> {50, 99.9}; each in [0, 100].
std::vector<double> parse_percentiles(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    double p = 0;
    if (!parse_number(item, p) || !(p >= 0 && p <= 100)) {
      throw FlagError("--percentiles '" + text +
                      "': expected numbers in [0, 100] separated by commas, e.g. 50,90,99.9");
    }
    out.push_back(p);
  }
  return out;
}

// "8x16,8" -> {{8, 16}, {8}}: one shape per tensor input, in flatten order.
std::vector<std::vector<int64_t>> parse_shapes(const std::string& text) {
  std::vector<std::vector<int64_t>> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    std::vector<int64_t> shape;
    bool ok = !item.empty() && item.back() != 'x';
    std::stringstream dims(item);
    for (std::string d; ok && std::getline(dims, d, 'x');) {
      int64_t size = 0;
      ok = parse_number(d, size) && size >= 0;
      shape.push_back(size);
    }
    if (!ok) {
      throw FlagError("--shapes '" + text +
                      "': expected one shape per tensor input, sizes joined by 'x' and shapes "
                      "by ',' (e.g. 8x16,8 for a [8, 16] and an [8] input)");
    }
    out.push_back(shape);
  }
  if (out.empty()) throw FlagError("--shapes is empty; e.g. --shapes 8x16");
  return out;
}

// Refuses bad flags before the artifact is loaded or anything runs.
void validate(const Options& opt, bool rtol_given, bool atol_given) {
  if (opt.batch < 0 || (opt.batch == 0 && opt.batch_given)) {
    throw FlagError("--batch " + std::to_string(opt.batch) + ": must be a positive integer");
  }
  if (!opt.shapes.empty()) parse_shapes(opt.shapes);
  parse_percentiles(opt.percentiles);
  auto non_negative = [](const char* flag, double v) {
    if (!(v >= 0) || !std::isfinite(v)) {
      std::ostringstream text;
      text << flag << " " << v << ": must be a finite number >= 0";
      throw FlagError(text.str());
    }
  };
  if (rtol_given) non_negative("--rtol", opt.rtol);
  if (atol_given) non_negative("--atol", opt.atol);
  non_negative("--warmup-ms", opt.warmup_ms);
  non_negative("--duration-s", opt.duration_s);
  if (opt.iterations < 0) throw FlagError("--iterations: must be >= 0 (0: adaptive)");
  try {
    at::Device device(opt.device);
    (void)device;
  } catch (const c10::Error&) {
    throw FlagError("--device '" + opt.device + "': not a device; use cpu, cuda or cuda:N");
  }
  if (!opt.json_file.empty()) {
    struct stat st{};
    const bool existed = ::stat(opt.json_file.c_str(), &st) == 0;
    int fd = ::open(opt.json_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0) {
      throw FlagError("--json " + opt.json_file + ": cannot write there (" + std::strerror(errno) +
                      ")");
    }
    ::close(fd);
    if (!existed) ::unlink(opt.json_file.c_str());
  }
}

std::string shape_str(const at::Tensor& t) {
  std::string s = honed::dtype_name(t.scalar_type()) + "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// The benchmark's inputs: the first stored sample, resized to --batch along each input's batch
// axis (rows repeated or cut, as honed.tune(batch_sizes=) does), or fresh tensors of --shapes.
std::vector<at::Tensor> bench_inputs(const honed::Model& model, const Options& opt) {
  std::vector<honed::Sample> samples = model.samples();
  if (!opt.shapes.empty()) {
    std::vector<std::vector<int64_t>> shapes = parse_shapes(opt.shapes);
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < shapes.size(); ++i) {
      at::ScalarType dtype = at::kFloat;
      if (!samples.empty() && i < samples[0].inputs.size()) {
        dtype = samples[0].inputs[i].scalar_type();
      }
      auto options = at::TensorOptions().dtype(dtype).device(model.device());
      out.push_back(at::isFloatingType(dtype) ? at::randn(shapes[i], options)
                                              : at::zeros(shapes[i], options));
    }
    return out;
  }
  if (samples.empty()) {
    throw honed::RuntimeError("the artifact stores no sample inputs; give --shapes");
  }
  if (opt.batch > 0) {
    return honed::resize_batch(samples[0].inputs, model.batch_axes(samples[0].graph), opt.batch);
  }
  return samples[0].inputs;
}

// Compares every stored sample's outputs with eager PyTorch's, stored next to it, with the
// tolerance the tune checked the graph with (or per dtype) unless --rtol/--atol.
bool check(const honed::Model& model, const Options& opt, json& report) {
  bool ok = true;
  int checked = 0;
  json rows = json::array();
  for (const honed::Sample& s : model.samples()) {
    if (s.expected.empty()) continue;
    std::vector<at::Tensor> outs = model.run(s.inputs);
    json row = {{"graph", s.graph}, {"ok", true}};
    std::string why;
    if (outs.size() != s.expected.size()) {
      why = std::to_string(outs.size()) + " outputs, expected " + std::to_string(s.expected.size());
    }
    double max_abs = 0;
    for (size_t i = 0; why.empty() && i < outs.size(); ++i) {
      const at::Tensor& want = s.expected[i];
      at::Tensor got = outs[i];
      if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) {
        why = "output " + std::to_string(i) + " is " + shape_str(got) + ", expected " +
              shape_str(want);
        break;
      }
      // The tune's own rule (src/honed/pipeline/correctness.py): |got - want| <= atol * max(1,
      // max |want|) + rtol * |want| and a cosine of at least min_cosine; float32 outputs with the
      // tolerance the artifact recorded for the graph, half-precision ones with honed's reduced
      // one.
      const bool reduced = want.scalar_type() == at::kHalf || want.scalar_type() == at::kBFloat16;
      const bool stored = !reduced && s.atol >= 0;
      double rtol = opt.rtol >= 0 ? opt.rtol : (stored ? s.rtol : (reduced ? 3e-2 : 1e-3));
      double atol = opt.atol >= 0 ? opt.atol : (stored ? s.atol : (reduced ? 3e-2 : 1e-4));
      const double min_cosine = stored ? s.min_cosine : (reduced ? 0.999 : 0.0);
      if (at::isFloatingType(want.scalar_type())) {
        at::Tensor g64 = got.to(at::kDouble), w64 = want.to(at::kDouble);
        at::Tensor diff = (g64 - w64).abs();
        max_abs = std::max(max_abs, diff.max().item<double>());
        const double scale = std::max(1.0, w64.abs().max().item<double>());
        const bool close = (diff <= atol * scale + rtol * w64.abs()).all().item<bool>();
        const double norms = g64.norm().item<double>() * w64.norm().item<double>();
        const double cosine = norms > 0 ? (g64 * w64).sum().item<double>() / norms : 1.0;
        if (!close) {
          why = "output " + std::to_string(i) + " differs from eager beyond rtol " +
                std::to_string(rtol) + " / atol " + std::to_string(atol);
        } else if (cosine < min_cosine) {
          why = "output " + std::to_string(i) + " has cosine " + std::to_string(cosine) +
                " with eager, below " + std::to_string(min_cosine);
        }
      } else if (!at::equal(got, want)) {
        why = "output " + std::to_string(i) + " differs from eager";
      }
    }
    ++checked;
    row["max_abs_error"] = max_abs;
    if (!why.empty()) {
      ok = false;
      row["ok"] = false;
      row["reason"] = why;
    }
    std::printf("check     graph %d: %s (max abs error %.3g)%s%s\n", s.graph,
                why.empty() ? "ok" : "MISMATCH", max_abs, why.empty() ? "" : ": ", why.c_str());
    rows.push_back(row);
  }
  if (checked == 0) {
    std::printf("check     FAILED: the artifact stores no reference outputs to compare with\n");
    ok = false;
  }
  report["check"] = {{"ok", ok}, {"graphs", rows}};
  return ok;
}

json stats_json(const honed::Stats& s, const std::vector<double>& samples,
                const std::vector<double>& percentiles) {
  json out = {{"median_ms", s.median_ms}, {"mean_ms", s.mean_ms},     {"min_ms", s.min_ms},
              {"max_ms", s.max_ms},       {"p90_ms", s.p90_ms},       {"p95_ms", s.p95_ms},
              {"p99_ms", s.p99_ms},       {"stddev_ms", s.stddev_ms}, {"cv", s.cv}};
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  json pct = json::object();
  for (double p : percentiles) {
    std::ostringstream key;
    key << "p" << p;
    pct[key.str()] = honed::quantile_sorted(sorted, p / 100.0);
  }
  out["percentiles_ms"] = pct;
  return out;
}

// "on, captured (graph:shapes): 0:1x16 0:8x16", or why CUDA graphs are off.
std::string cuda_graphs_line(const honed::Model& model) {
  std::string graphs = model.cuda_graphs_status();
  std::vector<honed::CudaGraphShape> captured = model.cuda_graphs();
  if (!captured.empty()) {
    graphs += ", captured (graph:shapes):";
    for (const honed::CudaGraphShape& c : captured) {
      std::string shapes;
      for (const std::vector<int64_t>& shape : c.shapes) {
        if (!shapes.empty()) shapes += ",";
        for (size_t d = 0; d < shape.size(); ++d) {
          if (d > 0) shapes += "x";
          shapes += std::to_string(shape[d]);
        }
      }
      graphs += " " + std::to_string(c.graph) + ":" + shapes;
    }
  }
  return graphs;
}

int main_impl(const Options& opt) {
  at::Device device(opt.device);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    throw honed::RuntimeError("--device " + opt.device + ": torch cannot use CUDA here (" +
                              std::to_string(torch::cuda::device_count()) + " GPUs visible)");
  }
  honed::ModelOptions mo;
  mo.module = opt.module;
  mo.runners = std::max(opt.threads, 1);
  mo.trust_native_code = opt.trust_native_code;
  mo.cuda_graphs = !opt.no_cuda_graphs;
  honed::Model model(opt.artifact, device, mo);
  json report = {{"artifact", opt.artifact},       {"module", model.module_name()},
                 {"device", model.device().str()}, {"honed", honed::version()},
                 {"torch", HONED_TORCH_VERSION},   {"load_s", model.load_seconds()}};
  report["load_phases"] = json::array();
  for (const honed::LoadPhase& p : model.load_phases()) {
    report["load_phases"].push_back({{"phase", p.name}, {"seconds", p.seconds}});
  }
  std::printf("honed-run %s · module %s · %d graph(s) on %s\n%s", opt.artifact.c_str(),
              model.module_name().c_str(), model.num_graphs(), model.device().str().c_str(),
              model.describe().c_str());
  std::string warmed;
  for (const auto& [graph, batch] : model.warmed()) {
    warmed += (warmed.empty() ? "" : ", ") + std::to_string(graph) + ":" +
              (batch > 0 ? std::to_string(batch) : "as stored");
  }
  std::printf("load      %.3f s (warm-up, graph:batch: %s)\n", model.load_seconds(),
              warmed.empty() ? "none" : warmed.c_str());
  std::string phases;
  for (const honed::LoadPhase& p : model.load_phases()) {
    char part[160];
    std::snprintf(part, sizeof part, "%s%s %.3f", phases.empty() ? "" : " · ", p.name.c_str(),
                  p.seconds);
    phases += part;
  }
  std::printf("          %s\n", phases.c_str());
  bool ok = true;
  if (opt.check) ok = check(model, opt, report);

  std::vector<at::Tensor> inputs = bench_inputs(model, opt);
  std::string shapes;
  for (const at::Tensor& t : inputs) shapes += (shapes.empty() ? "" : ", ") + shape_str(t);
  std::vector<std::vector<int64_t>> dims;
  for (const at::Tensor& t : inputs) dims.emplace_back(t.sizes().begin(), t.sizes().end());
  const honed::CallBatch batch = honed::batch_of(model.batch_axes(model.select(inputs)), dims);
  const int64_t batch_size = batch.size;
  std::printf("inputs    %s (batch %lld: %s)\n", shapes.c_str(), static_cast<long long>(batch_size),
              batch.source.c_str());

  honed::run::BenchConfig cfg{opt.warmup_ms, opt.duration_s, opt.iterations, opt.threads,
                              batch_size};
  const bool cuda = device.is_cuda();
  auto make_timer = [&]() -> std::unique_ptr<honed::Timer> {
    if (cuda && opt.threads <= 1) return std::make_unique<honed::CudaEventTimer>(0);
    if (cuda) return std::make_unique<honed::HostTimer>([] { torch::cuda::synchronize(); });
    return std::make_unique<honed::HostTimer>();
  };
  auto call = [&] { model.run(inputs); };
  honed::run::BenchResult r = honed::run::bench(call, make_timer, cfg);
  const honed::Measurement& m = r.measurement;
  const honed::Stats& s = m.stats;
  const char* clock = cuda && opt.threads <= 1 ? "CUDA events" : "host clock";
  std::printf("latency   median %.4f ms · p90 %.4f · p95 %.4f · p99 %.4f · mean %.4f · CV %.1f%%\n",
              s.median_ms, s.p90_ms, s.p95_ms, s.p99_ms, s.mean_ms, 100 * s.cv);
  std::printf("          %lld calls on %d thread(s), %s%s\n", static_cast<long long>(m.calls),
              r.threads, clock, r.adaptive ? (m.stable ? ", stable" : ", UNSTABLE") : "");
  if (m.has_host) std::printf("host      median %.4f ms\n", m.host_stats.median_ms);
  std::printf("throughput %.1f samples/s\n", m.throughput);
  std::printf("cuda graphs %s\n", cuda_graphs_line(model).c_str());

  std::vector<double> percentiles = parse_percentiles(opt.percentiles);
  report["inputs"] = shapes;
  report["batch_size"] = batch_size;
  report["threads"] = r.threads;
  report["clock"] = clock;
  report["calls"] = m.calls;
  report["wall_s"] = m.wall_ms / 1000;
  report["stable"] = m.stable;
  report["adaptive"] = r.adaptive;
  report["throughput"] = m.throughput;
  report["cuda_graphs"] = model.cuda_graphs_status();
  report["latency"] = stats_json(s, m.samples_ms, percentiles);
  if (m.has_host) report["host_latency"] = {{"median_ms", m.host_stats.median_ms}};
  if (!opt.json_file.empty()) {
    std::ofstream out(opt.json_file);
    out << report.dump(2) << "\n";
    out.close();
    if (!out) throw std::runtime_error("--json " + opt.json_file + ": writing failed");
  }
  if (!ok) std::printf("check     FAILED: outputs differ from the stored eager outputs\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"honed-run: load a .honed artifact with the C++ runtime, check and benchmark it"};
  Options opt;
  app.add_option("artifact", opt.artifact, "the .honed file")->required();
  app.add_option("--device", opt.device, "cpu, cuda or cuda:N (the artifact's device type)")
      ->capture_default_str();
  app.add_option("--module", opt.module, "which module of the artifact (default: its only one)");
  app.add_option("--batch", opt.batch, "resize the stored sample to this batch size");
  app.add_option("--shapes", opt.shapes, "input shapes instead of the stored sample: 8x16,8");
  app.add_option("--warmup-ms", opt.warmup_ms, "warm-up time (at least 10 calls)")
      ->capture_default_str();
  app.add_option("--duration-s", opt.duration_s,
                 "measure this long per thread (default: the engine's adaptive protocol)");
  app.add_option("--iterations", opt.iterations, "measure exactly this many calls per thread");
  app.add_option("--threads", opt.threads, "threads calling the model at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--percentiles", opt.percentiles, "percentiles for --json, comma-separated")
      ->capture_default_str();
  app.add_option("--json", opt.json_file, "write the results as JSON to this file");
  app.add_flag(
      "--check", opt.check,
      "compare outputs with the eager outputs stored in the artifact (exit 1 on mismatch)");
  auto* rtol = app.add_option("--rtol", opt.rtol, "--check relative tolerance (default: by dtype)");
  auto* atol = app.add_option("--atol", opt.atol, "--check absolute tolerance (default: by dtype)");
  app.add_flag("--no-cuda-graphs", opt.no_cuda_graphs,
               "launch every kernel instead of replaying CUDA graphs (ModelOptions::cuda_graphs)");
  app.add_flag("--trust-native-code", opt.trust_native_code,
               "load the artifact's compiled code even when no trusted key signed it "
               "(docs/trust.md)");
  try {
    app.parse(argc, argv);
    opt.batch_given = app.count("--batch") > 0;
    validate(opt, rtol->count() > 0, atol->count() > 0);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "honed-run: %s; see honed-run --help\n", e.what());
    return 2;
  } catch (const FlagError& e) {
    std::fprintf(stderr, "honed-run: %s\n", e.what());
    return 2;
  }
  try {
    return main_impl(opt);
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    std::fprintf(stderr, "honed-run: %s\n", msg.substr(0, msg.find('\n')).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "honed-run: %s\n", e.what());
    return 2;
  }
}
