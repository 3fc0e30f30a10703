// cpp/include/honed/runtime.h: honed::Model runs a .honed artifact from C++ (libhoned_runtime).
//
//   honed::Model model("model.honed", torch::kCPU);     // or torch::Device("cuda:0")
//   std::vector<at::Tensor> outputs = model.run(inputs);
//
// Inputs are the module's tensor inputs in flatten order of (args, kwargs), the order honed's
// profiles use; non-tensor inputs were baked in when the graph was compiled. Outputs are the
// module's output tensors in flatten order. (at::Tensor is torch::Tensor; c10::Device is
// torch::Device: this header includes only the ATen parts it needs.)
//
// Threads: run() may be called from several threads at once. Each graph is one AOTInductor
// package loaded once, holding ModelOptions::runners model instances (AOTInductor's own pool,
// which shares the weights); a call takes a free instance and waits when all are busy. So set
// runners to the number of threads that call at once.
//
// CUDA graphs (ModelOptions::cuda_graphs, on by default on CUDA): each call's exact input shapes
// get a CUDA graph, captured the first time they are seen (loading warms every batch size of the
// profile, so those are captured while loading) and replayed afterwards: the inputs are copied
// into the graph's own buffers, and the outputs come back as fresh tensors that no later call
// overwrites. The graphs share those buffers and one memory pool, so calls then run one at a
// time per Model (runners does not apply). A graph that cannot be captured (it synchronizes with
// the host, say) runs as a plain call, with one message on stderr.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace honed {

// A call the artifact cannot serve (inputs outside every tuned profile, wrong device or dtype),
// or an artifact that cannot run here (no graph runnable from C++, other GPU or torch). The
// engine's honed::ArtifactError (honed/artifact.h) is thrown for damaged files.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ModelOptions {
  std::string module;        // which module of the artifact; "" = its only one
  int runners = 1;           // model instances per graph (concurrent calls); see above
  bool check_inputs = true;  // dtypes, devices and sizes against what each graph was compiled for
  // The packages are native code: they load only from an artifact signed by a trusted key
  // (docs/trust.md), or when this is true.
  bool trust_native_code = false;
  // Run each graph's stored sample at every batch size of its profile (min, opt, max) while
  // loading, so the first calls are not slower than the rest.
  bool warm_up = true;
  // Public keys (PEM) whose signatures are trusted; empty: those `honed trust` added
  // ($XDG_CONFIG_HOME/honed/trusted or ~/.config/honed/trusted).
  std::vector<std::string> trusted_keys;
  // On CUDA: replay a CUDA graph per input shape instead of launching every kernel (see above).
  bool cuda_graphs = true;
  // At most this many captured shapes per model; calls of further shapes run plain (one message).
  int max_cuda_graphs = 64;
};

// Where the constructor's time went, in order ("read and verify", "write package files", ...).
struct LoadPhase {
  std::string name;
  double seconds = 0;
};

// One captured CUDA graph: the graph (index into the model's graphs) and its input shapes.
struct CudaGraphShape {
  int graph = 0;
  std::vector<std::vector<int64_t>> shapes;
};

// A sample stored in the artifact: the inputs a graph was tuned on and eager PyTorch's outputs
// for them (empty when the artifact has none), on the model's device.
struct Sample {
  int graph = 0;
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> expected;
  // The bar the tune's correctness check held this graph's float32 outputs to (its precision:
  // bf16 weights, TF32), as saved; atol < 0 when the artifact does not say.
  double atol = -1;
  double rtol = -1;
  double min_cosine = 0;
};

class Model {
 public:
  // Reads and verifies the artifact (every entry's CRC and SHA-256, format, environment, the
  // signature of its native code), then loads each graph runnable from C++ on `device` ("cuda"
  // without an index means cuda:0). Throws honed::ArtifactError (UntrustedArtifactError for an
  // unsigned or unknown signer) / honed::RuntimeError.
  explicit Model(const std::string& path, const c10::Device& device = c10::Device(c10::kCPU),
                 const ModelOptions& options = {});
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  // Runs the graph whose profile holds these inputs. cuda_stream: a cudaStream_t to run on;
  // nullptr runs on the current CUDA stream of the device. Thread-safe.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs,
                              void* cuda_stream = nullptr) const;

  // The graph run() would pick, or a RuntimeError naming every stored profile.
  int select(const std::vector<at::Tensor>& inputs) const;

  const c10::Device& device() const;
  const std::string& module_name() const;
  int num_graphs() const;
  std::string describe() const;         // one line per graph: backend, profile
  std::vector<Sample> samples() const;  // stored samples of the runnable graphs
  double load_seconds() const;          // wall time of the constructor
  // Per graph and tensor input: its batch axis (-1 for none), from the tuned profile.
  std::vector<int> batch_axes(int graph) const;
  // (graph, batch size) of every warm-up call made while loading (batch 0: the sample as stored).
  const std::vector<std::pair<int, int64_t>>& warmed() const;
  const std::vector<LoadPhase>& load_phases() const;
  // Whether calls go through CUDA graphs ("on"), or why not ("off: ..."); and the graphs captured
  // so far (empty when off).
  std::string cuda_graphs_status() const;
  std::vector<CudaGraphShape> cuda_graphs() const;

 private:
  void warm_up();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `inputs` with each tensor cut or repeated to `batch` rows along its batch axis (-1: left as it
// is), as honed.tune(batch_sizes=) resizes samples.
std::vector<at::Tensor> resize_batch(const std::vector<at::Tensor>& inputs,
                                     const std::vector<int>& batch_axes, int64_t batch);

// Maps torch dtypes to the names honed's graph keys use ("float32", "int64", ...).
std::string dtype_name(c10::ScalarType type);

}  // namespace honed
