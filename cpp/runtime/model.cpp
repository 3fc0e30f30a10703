// cpp/runtime/model.cpp: honed::Model: verify the artifact, load its AOTInductor graphs, dispatch.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <nlohmann/json.hpp>
#include <set>

#include "constants.h"
#include "cuda_graphs.h"
#include "honed/artifact.h"
#include "honed/dispatch.h"
#include "honed/env.h"
#include "honed/runtime.h"
#include "honed/shapes.h"
#include "package.h"
#include "tensors.h"

namespace honed {
namespace {

using json = nlohmann::json;

constexpr const char* kPackage = "model.pt2";  // backend/torch_inductor_aot.py PAYLOAD_PACKAGE
constexpr const char* kCalling = "calling.json";

}  // namespace

// Named, not anonymous: Model::Impl holds them, and GCC warns of a class with external linkage
// holding a type with internal linkage from a file included into another, as the runtime's
// sources are (one translation unit, cpp/runtime/CMakeLists.txt).
namespace model_detail {

// A graph key split into its structure and per-leaf template: a tensor leaf takes the call's
// dtype and rank (and the stored device string), a constant is fixed.
struct KeyTemplate {
  std::string structure;
  std::vector<std::optional<Constant>> leaves;  // nullopt: a tensor leaf
  std::vector<std::string> devices;             // per tensor leaf, as stored ("cuda:0")
  // Per tensor leaf, as stored: a call whose tensors have these dtypes and ranks (and the model's
  // device, checked first) has exactly the stored graph key, so run() builds no key string.
  std::vector<c10::ScalarType> dtypes;
  std::vector<size_t> ranks;
};

struct Graph {
  ManifestGraph stored;
  KeyTemplate key;
  uint64_t key_hash = 0;  // graph_hash(stored.profile.graph_key)
  InputGuard guard;       // the profile the package was compiled for (the engine checks it)
  std::unique_ptr<detail::Package> package;
};

}  // namespace model_detail

using model_detail::Graph;
using model_detail::KeyTemplate;

namespace {

KeyTemplate key_template(const std::string& key) {
  ParsedKey parsed;
  try {
    parsed = parse_graph_key(key);
  } catch (const std::invalid_argument& e) {
    throw RuntimeError(std::string("honed runtime: ") + e.what());
  }
  KeyTemplate t;
  t.structure = parsed.structure;
  for (KeyLeaf& leaf : parsed.leaves) {
    if (leaf.constant) {
      t.leaves.emplace_back(std::move(*leaf.constant));
      continue;
    }
    t.leaves.emplace_back(std::nullopt);
    t.devices.push_back(leaf.device);
    t.dtypes.push_back(detail::dtype_from_name(leaf.dtype));
    t.ranks.push_back(leaf.rank);
  }
  return t;
}

// The engine's guard of a package: calling.json's "guard" profile (backend/_calling.py); files of
// format 1 were compiled for exactly the stored profile.
InputGuard read_guard(std::string_view calling_json, const GraphProfile& stored) {
  json c = json::parse(calling_json);
  const int format = c.value("format", 0);
  if (format == 1) return InputGuard(stored);
  if (format != 2) {
    throw RuntimeError("honed runtime: calling.json has format " + std::to_string(format) +
                       "; this runtime reads formats 1 and 2: re-save with this honed version");
  }
  return InputGuard(profile_from_json(c.at("guard").dump()));
}

std::string shape_str(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

HostEnvironment host_environment(const c10::Device& device) {
  HostEnvironment here;
  here.torch = HONED_TORCH_VERSION;
  here.cuda_available = torch::cuda::is_available();
  if (here.cuda_available) {
    GpuProbe probe = probe_gpus();
    int index = device.is_cuda() && device.has_index() ? device.index() : 0;
    for (const GpuInfo& gpu : probe.gpus) {
      if (gpu.index != index) continue;
      here.gpu = gpu.name;
      here.compute_capability = std::to_string(gpu.cc_major) + "." + std::to_string(gpu.cc_minor);
    }
  }
  return here;
}

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string describe_profile(const GraphProfile& p) {
  std::string out;
  for (size_t i = 0; i < p.axes.size(); ++i) {
    out += (i ? ", " : "") + std::string("[");
    for (size_t a = 0; a < p.axes[i].size(); ++a) {
      const Axis& ax = p.axes[i][a];
      out += (a ? ", " : "");
      out += ax.min == ax.max ? std::to_string(ax.min)
                              : (ax.name.empty() ? "" : ax.name + " ") + std::to_string(ax.min) +
                                    ".." + std::to_string(ax.max);
    }
    out += "]";
  }
  return out;
}

}  // namespace

struct Model::Impl {
  c10::Device device{c10::kCPU};
  ModelOptions options;
  std::string path;
  std::string module;
  std::vector<Graph> graphs;
  Dispatcher dispatcher;
  Artifact artifact;  // the verified file, mapped: payload, sample and output entries
  double load_seconds = 0;
  std::vector<LoadPhase> phases;
  std::vector<std::pair<int, int64_t>> warmed;      // (graph, batch size; 0: as stored) run at load
  std::unique_ptr<detail::CudaGraphs> cuda_graphs;  // null: plain calls
  std::string cuda_graphs_status = "off: the model runs on the CPU";

  // Whether calls go through CUDA graphs; says why not once when they were asked for.
  bool use_cuda_graphs();

  void load(const std::string& artifact_path);
  void check_trust(const std::vector<const ManifestGraph*>& runnable) const;
  const ManifestModule& pick_module() const;
  std::string profiles() const;
  // Throws the RuntimeError for inputs no graph takes, with the dispatcher's reasons.
  [[noreturn]] void no_graph_for(const std::vector<at::Tensor>& inputs) const;
};

const ManifestModule& Model::Impl::pick_module() const {
  std::string names;
  for (const ManifestModule& m : artifact.manifest.modules) {
    if (m.name == options.module ||
        (options.module.empty() && artifact.manifest.modules.size() == 1)) {
      return m;
    }
    names += (names.empty() ? "" : ", ") + m.name;
  }
  throw RuntimeError("honed runtime: " + path + " holds module(s) " + names + "; " +
                     (options.module.empty() ? "choose one with ModelOptions::module"
                                             : "it has no module '" + options.module + "'"));
}

// Every graph the runtime can run is an AOTInductor package: native code, which is loaded only
// from an artifact a trusted key signed, or with ModelOptions::trust_native_code (docs/trust.md).
void Model::Impl::check_trust(const std::vector<const ManifestGraph*>& runnable) const {
  if (runnable.empty() || options.trust_native_code) return;
  std::vector<std::string> keys = options.trusted_keys;
  if (keys.empty()) keys = trusted_keys(config_dir());
  TrustCheck check = honed::check_trust(artifact, keys);
  if (check.trust == Trust::kTrusted) return;
  throw UntrustedArtifactError(untrusted_message(
      path, check, "AOTInductor package '" + runnable[0]->payload.at(kPackage) + "'",
      "honed-run --trust-native-code (C++: ModelOptions::trust_native_code)"));
}

bool Model::Impl::use_cuda_graphs() {
  if (!device.is_cuda()) return false;
  if (!options.cuda_graphs) {
    cuda_graphs_status = "off: ModelOptions::cuda_graphs is false";
    return false;
  }
  const std::string why = detail::cuda_graphs_unavailable();
  if (!why.empty()) {
    cuda_graphs_status = "off: " + why;
    std::fprintf(stderr, "honed runtime: CUDA graphs are off: %s\n", why.c_str());
    return false;
  }
  cuda_graphs_status = "on";
  return true;
}

void Model::Impl::load(const std::string& artifact_path) {
  // CUDA's start-up (driver, context, allocator, cuBLAS) needs nothing from the file: it runs
  // beside the reading and verifying.
  std::future<void> cuda_started;
  if (device.is_cuda() && torch::cuda::is_available()) {
    cuda_started = std::async(std::launch::async, [where = device] {
      c10::OptionalDeviceGuard on(where);
      at::empty({1}, at::TensorOptions().device(where));
      detail::start_cuda_libraries(where);
    });
  }
  auto start = std::chrono::steady_clock::now();
  artifact = read_artifact(artifact_path);
  phases.push_back({"read and verify the artifact", since(start)});
  start = std::chrono::steady_clock::now();
  const Manifest& manifest = artifact.manifest;
  std::string why =
      incompatibility(manifest.env(), manifest.has_payload(), host_environment(device));
  if (!why.empty()) {
    throw IncompatibleArtifactError(path + " was made for " + why +
                                    "; re-tune on this machine (honed.tune(..., target='cpp'))");
  }
  const ManifestModule& m = pick_module();
  module = m.name;
  const std::string saved_device = manifest.env().device;
  const bool saved_cuda = saved_device.rfind("cuda", 0) == 0;
  if (saved_cuda != device.is_cuda()) {
    throw RuntimeError("honed runtime: " + path + " was compiled for " + saved_device +
                       ", not for " + device.str() + "; load it on a " +
                       (saved_cuda ? "CUDA" : "CPU") + " device");
  }
  std::vector<const ManifestGraph*> runnable;
  std::string skipped;
  for (const ManifestGraph& g : m.graphs) {
    if (!g.runnable_from_cpp || !g.payload.count(kPackage) || !g.payload.count(kCalling)) {
      skipped += (skipped.empty() ? "" : ", ") + g.backend_name();
      continue;
    }
    runnable.push_back(&g);
  }
  if (runnable.empty()) {
    throw RuntimeError("honed runtime: module '" + module + "' of " + path +
                       " has no graph the C++ runtime can run (its graphs use: " +
                       (skipped.empty() ? "none" : skipped) +
                       "); tune it with honed.tune(..., target='cpp') and save it again");
  }
  check_trust(runnable);
  phases.push_back({"check the environment, manifest and signature", since(start)});
  c10::OptionalDeviceGuard guard;  // load the packages with the model's GPU current
  if (device.is_cuda()) {
    start = std::chrono::steady_clock::now();
    if (cuda_started.valid()) cuda_started.get();  // rethrows what starting CUDA threw
    guard.reset_device(device);
    phases.push_back({"start CUDA on the device (what is left of it)", since(start)});
  }
  const bool graphed = use_cuda_graphs();
  double write_s = 0, open_s = 0, constants_s = 0;
  for (const ManifestGraph* g : runnable) {
    Graph graph{*g, key_template(g->profile.graph_key), graph_hash(g->profile.graph_key),
                read_guard(artifact.entry(g->payload.at(kCalling)), g->profile),
                std::make_unique<detail::Package>(artifact.entry(g->payload.at(kPackage)), device,
                                                  graphed ? 1 : options.runners, graphed)};
    write_s += graph.package->write_seconds();
    open_s += graph.package->open_seconds();
    // A package compiled without its weights (backend/_aoti_constants.py) gets them from the
    // module's weights entry and its own constants file; older packages hold them in the library.
    if (g->payload.count(detail::kConstantsJson)) {
      start = std::chrono::steady_clock::now();
      auto stored = g->payload.find(detail::kConstantsFile);
      graph.package->give_constants(
          artifact.entry(g->payload.at(detail::kConstantsJson)), artifact.entry(m.weights),
          stored == g->payload.end() ? std::string_view() : artifact.entry(stored->second), device);
      constants_s += since(start);
    }
    dispatcher.add(g->profile, static_cast<int>(graphs.size()));
    graphs.push_back(std::move(graph));
  }
  phases.push_back({"write the packages' library and kernel files", write_s});
  phases.push_back({"load the libraries (dlopen, the runner's set-up)", open_s});
  phases.push_back({"give the packages their constants from the weights", constants_s});
  if (graphed) cuda_graphs = std::make_unique<detail::CudaGraphs>(device, options.max_cuda_graphs);
}

std::string Model::Impl::profiles() const {
  std::string out;
  for (size_t i = 0; i < graphs.size(); ++i) {
    out += (i ? "; " : "") + std::string("graph ") + std::to_string(i) + ": " +
           graphs[i].stored.profile.graph_key + " " + describe_profile(graphs[i].stored.profile);
  }
  return out;
}

Model::Model(const std::string& path, const c10::Device& device, const ModelOptions& options)
    : impl_(std::make_unique<Impl>()) {
  auto start = std::chrono::steady_clock::now();
  // "cuda" means the first GPU: inputs' devices are compared with an indexed device.
  impl_->device = device.is_cuda() && !device.has_index() ? c10::Device(c10::kCUDA, 0) : device;
  impl_->options = options;
  impl_->path = path;
  impl_->load(path);
  if (options.warm_up) {
    auto warm_start = std::chrono::steady_clock::now();
    warm_up();
    impl_->phases.push_back(
        {impl_->cuda_graphs ? "warm up and capture CUDA graphs" : "warm up", since(warm_start)});
  }
  impl_->load_seconds = since(start);
}

// Runs each graph's stored sample once at every batch size of its profile (min, opt, max), so
// that lazily loaded kernels and first-call set-up happen here rather than in the first calls.
void Model::warm_up() {
  for (const Sample& sample : samples()) {
    const GraphProfile& p = impl_->graphs[static_cast<size_t>(sample.graph)].stored.profile;
    const std::vector<int>& axes = p.batch_axes;
    std::set<int64_t> sizes;
    if (std::any_of(axes.begin(), axes.end(), [](int a) { return a >= 0; })) {
      sizes = {p.min_batch, p.opt_batch, p.max_batch};
    } else {
      sizes = {0};  // no batch axis: the sample as it is
    }
    for (int64_t batch : sizes) {
      run(batch > 0 ? resize_batch(sample.inputs, axes, batch) : sample.inputs);
      impl_->warmed.emplace_back(sample.graph, batch);
    }
  }
}

std::vector<at::Tensor> resize_batch(const std::vector<at::Tensor>& inputs,
                                     const std::vector<int>& batch_axes, int64_t batch) {
  std::vector<at::Tensor> out = inputs;
  for (size_t i = 0; i < out.size(); ++i) {
    const int axis = i < batch_axes.size() ? batch_axes[i] : -1;
    if (axis < 0) continue;
    std::vector<int64_t> rows = batch_indices(out[i].size(axis), batch);
    at::Tensor index = at::tensor(rows, at::TensorOptions().dtype(at::kLong)).to(out[i].device());
    out[i] = out[i].index_select(axis, index).contiguous();
  }
  return out;
}

const std::vector<std::pair<int, int64_t>>& Model::warmed() const { return impl_->warmed; }
const std::vector<LoadPhase>& Model::load_phases() const { return impl_->phases; }
std::string Model::cuda_graphs_status() const { return impl_->cuda_graphs_status; }

std::vector<CudaGraphShape> Model::cuda_graphs() const {
  return impl_->cuda_graphs ? impl_->cuda_graphs->captured() : std::vector<CudaGraphShape>{};
}

Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

int Model::select(const std::vector<at::Tensor>& inputs) const {
  const Impl& im = *impl_;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      throw RuntimeError("honed runtime: input " + std::to_string(i) + " is an undefined tensor");
    }
    if (inputs[i].device() != im.device) {
      throw RuntimeError("honed runtime: input " + std::to_string(i) + " is on " +
                         inputs[i].device().str() + " but the model runs on " + im.device.str() +
                         "; move it with .to(model.device())");
    }
  }
  // Fast path: a graph whose stored dtypes and ranks the inputs have shares their graph key; the
  // engine's dispatcher then checks the sizes against the profiles. Allocates nothing per call.
  thread_local std::vector<int64_t> sizes;
  for (const Graph& g : im.graphs) {
    const KeyTemplate& k = g.key;
    if (k.dtypes.size() != inputs.size()) continue;
    bool same = true;
    for (size_t i = 0; i < inputs.size() && same; ++i) {
      same = inputs[i].scalar_type() == k.dtypes[i] &&
             static_cast<size_t>(inputs[i].dim()) == k.ranks[i];
    }
    if (!same) continue;
    sizes.clear();
    for (const at::Tensor& x : inputs) {
      const at::IntArrayRef shape = x.sizes();
      sizes.insert(sizes.end(), shape.begin(), shape.end());
    }
    const int hit = im.dispatcher.lookup(g.stored.profile.graph_key, g.key_hash, sizes);
    if (hit >= 0) return hit;
  }
  im.no_graph_for(inputs);
}

void Model::Impl::no_graph_for(const std::vector<at::Tensor>& inputs) const {
  std::string reasons;
  for (const Graph& g : graphs) {
    if (g.key.devices.size() != inputs.size()) continue;
    Signature sig{g.key.structure, {}};
    size_t t = 0;
    for (const std::optional<Constant>& leaf : g.key.leaves) {
      if (leaf) {
        sig.leaves.emplace_back(*leaf);
        continue;
      }
      const at::Tensor& x = inputs[t];
      sig.leaves.emplace_back(
          TensorSpec{x.sizes().vec(), dtype_name(x.scalar_type()), g.key.devices[t]});
      ++t;
    }
    DispatchResult hit = dispatcher.lookup(sig);
    if (hit.variant >= 0) {  // the fast path and this one disagree: a bug, never a wrong graph
      throw std::logic_error("honed runtime: dispatch fast path missed graph " +
                             std::to_string(hit.variant) + " for " + graph_key(sig));
    }
    if (reasons.find(hit.reason) == std::string::npos) {
      reasons += (reasons.empty() ? "" : "; ") + hit.reason;
    }
  }
  std::string shapes;
  for (const at::Tensor& x : inputs) {
    shapes += (shapes.empty() ? "" : ", ") + dtype_name(x.scalar_type()) + shape_str(x.sizes());
  }
  throw RuntimeError(
      "honed runtime: module '" + module + "': no tuned graph takes inputs (" + shapes + ") [" +
      (reasons.empty() ? "wrong number of tensor inputs" : reasons) +
      "]. Stored profiles: " + profiles() + ". Tune with samples like these inputs to cover them");
}

std::vector<at::Tensor> Model::run(const std::vector<at::Tensor>& inputs, void* cuda_stream) const {
  const int index = select(inputs);
  const Graph& g = impl_->graphs[static_cast<size_t>(index)];
  // The model's GPU current on this thread (a thread that never touched CUDA has no context, and
  // cuBLAS needs one); restored on return.
  c10::OptionalDeviceGuard guard;
  if (impl_->device.is_cuda()) guard.reset_device(impl_->device);
  if (impl_->options.check_inputs) {  // dispatch matched the key: the sizes are left to check
    thread_local std::vector<int64_t> sizes;
    sizes.clear();
    for (const at::Tensor& x : inputs)
      sizes.insert(sizes.end(), x.sizes().begin(), x.sizes().end());
    if (!g.guard.fits_sizes(sizes)) {
      throw RuntimeError("honed runtime: the package was compiled for other shapes: " +
                         g.guard.explain_sizes(sizes));
    }
  }
  const bool all_contiguous = std::all_of(inputs.begin(), inputs.end(),
                                          [](const at::Tensor& t) { return t.is_contiguous(); });
  std::vector<at::Tensor> contiguous;
  if (!all_contiguous) {
    contiguous.reserve(inputs.size());
    for (const at::Tensor& t : inputs) contiguous.push_back(t.contiguous());
  }
  const std::vector<at::Tensor>& args = all_contiguous ? inputs : contiguous;
  if (!impl_->cuda_graphs) return g.package->run(args, cuda_stream);
  const detail::Package& package = *g.package;
  return impl_->cuda_graphs->run(index, args, cuda_stream,
                                 [&package](const std::vector<at::Tensor>& in, void* stream) {
                                   return package.run(in, stream);
                                 });
}

const c10::Device& Model::device() const { return impl_->device; }
const std::string& Model::module_name() const { return impl_->module; }
int Model::num_graphs() const { return static_cast<int>(impl_->graphs.size()); }
double Model::load_seconds() const { return impl_->load_seconds; }

std::string Model::describe() const {
  std::string out;
  for (size_t i = 0; i < impl_->graphs.size(); ++i) {
    const Graph& g = impl_->graphs[i];
    out += "graph " + std::to_string(i) + ": " + g.stored.backend_name() + " " +
           g.stored.profile.graph_key + " " + describe_profile(g.stored.profile) + "\n";
  }
  return out;
}

std::vector<int> Model::batch_axes(int graph) const {
  return impl_->graphs.at(static_cast<size_t>(graph)).stored.profile.batch_axes;
}

std::vector<Sample> Model::samples() const {
  std::vector<Sample> out;
  for (size_t i = 0; i < impl_->graphs.size(); ++i) {
    const ManifestGraph& g = impl_->graphs[i].stored;
    if (g.samples.empty()) continue;
    Sample s;
    s.graph = static_cast<int>(i);
    const auto tol = g.figures.find("check_tolerance");
    if (tol != g.figures.end() && tol->is_object()) {
      s.atol = tol->value("atol", -1.0);
      s.rtol = tol->value("rtol", -1.0);
      s.min_cosine = tol->value("min_cosine", 0.0);
    }
    const std::string_view stored = impl_->artifact.entry(g.samples);
    for (at::Tensor& t : detail::tensors_with_prefix(stored, "leaf")) {
      s.inputs.push_back(t.to(impl_->device));
    }
    // A large sample is stored as its first items (honed.save): repeated in turn up to the batch
    // eager's outputs were computed at, as Python's reader does.
    const detail::StoredBatch repeat = detail::stored_sample_batch(stored);
    if (repeat.batch > 0) s.inputs = resize_batch(s.inputs, repeat.axes, repeat.batch);
    if (!g.outputs.empty()) {
      for (at::Tensor& t : detail::tensors_with_prefix(impl_->artifact.entry(g.outputs), "out")) {
        s.expected.push_back(t.to(impl_->device));
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace honed
