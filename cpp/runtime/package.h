// cpp/runtime/package.h: an AOTInductor package loaded from its bytes in the artifact (private).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace torch::inductor {
class AOTIModelContainerRunner;
}

namespace honed::detail {

// One AOTInductor package (.pt2), loaded without torch's package loader, which would extract every
// file of the package into a folder of its own. The .pt2 is a view into the mapped artifact whose
// entries torch stores uncompressed, so only the files the model container reads from disk are
// written, each once, straight from the mapping into a private folder: the compiled library (for
// dlopen; removed again once loaded) and the kernel binaries and sidecar files it loads lazily
// (kept while the package lives). The runner is torch's own (AOTIModelContainerRunner).
class Package {
 public:
  // device: where it runs ("cuda:0" or "cpu"); runners: model instances (AOTInductor's pool);
  // single_threaded: AOTInductor's single-threaded runner (no per-run CUDA events; the caller
  // serializes calls). Throws honed::RuntimeError for a package that is not one.
  Package(std::string_view pt2, const c10::Device& device, int runners, bool single_threaded);
  ~Package();
  Package(const Package&) = delete;
  Package& operator=(const Package&) = delete;

  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, void* cuda_stream) const;

  // A package compiled without its weights gets them here, before it runs (constants.h; the
  // views are the artifact's mapping). Returns the bytes placed on the device.
  size_t give_constants(std::string_view listing, std::string_view weights, std::string_view stored,
                        const c10::Device& device);

  double write_seconds() const { return write_seconds_; }  // writing the package's files
  double open_seconds() const { return open_seconds_; }    // dlopen and the container's set-up
  size_t written_bytes() const { return written_bytes_; }

 private:
  void remove_files();

  std::string dir_;
  std::vector<std::string> kept_;      // files in dir_, removed by the destructor
  std::vector<std::string> subdirs_;   // folders made below dir_, in order of creation
  std::vector<at::Tensor> constants_;  // used in place by the runner, so destroyed after it
  std::unique_ptr<torch::inductor::AOTIModelContainerRunner> runner_;
  double write_seconds_ = 0, open_seconds_ = 0;
  size_t written_bytes_ = 0;
};

}  // namespace honed::detail
