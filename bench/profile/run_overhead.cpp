// bench/profile/run_overhead.cpp: what honed::Model::run adds to libtorch's AOTInductor loader.
// Loads ARTIFACT with honed::Model and its package (PACKAGE.pt2, written by make_cpp_artifact.py)
// with libtorch's loader alone (given PACKAGE.pt2.constants when the package holds code only),
// then times, in alternating rounds on the same inputs:
//   select  honed::Model::select (the per-call dispatch, no inference)
//   honed   honed::Model::run
//   raw     AOTIModelPackageLoader::run
// Each round is CALLS back-to-back calls timed on the host clock (one device sync at the end);
// prints the median per-call time of each over the rounds, in microseconds.
// usage: run_overhead ARTIFACT PACKAGE DEVICE(cpu|cuda) ROWSxCOLS [ROUNDS] [CALLS]
#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/cuda.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "honed/runtime.h"

namespace {

double per_call_us(const std::function<void()>& call, int calls, bool cuda) {
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) call();
  if (cuda) torch::cuda::synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
             .count() /
         calls;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: run_overhead ARTIFACT PACKAGE DEVICE SHAPE [ROUNDS] [CALLS]\n");
    return 2;
  }
  const c10::Device device(argv[3]);
  std::vector<int64_t> shape;
  std::stringstream ss(argv[4]);
  for (std::string d; std::getline(ss, d, 'x');) shape.push_back(std::stoll(d));
  const int rounds = argc > 5 ? std::stoi(argv[5]) : 31;
  const int calls = argc > 6 ? std::stoi(argv[6]) : 200;
  const bool cuda = device.is_cuda();

  honed::ModelOptions options;
  options.trust_native_code = true;  // the artifact make_cpp_artifact.py just built here
  honed::Model model(argv[1], device, options);
  torch::inductor::AOTIModelPackageLoader raw(argv[2], "model", false, 1,
                                              cuda ? static_cast<c10::DeviceIndex>(0) : -1);
  // A package without its weights: give libtorch's loader the constants honed gives its own.
  std::ifstream stored(std::string(argv[2]) + ".constants", std::ios::binary);
  if (stored) {
    const std::vector<char> bytes((std::istreambuf_iterator<char>(stored)),
                                  std::istreambuf_iterator<char>());
    std::unordered_map<std::string, at::Tensor> constants;
    for (const auto& kv : torch::pickle_load(bytes).toGenericDict()) {
      constants.emplace(kv.key().toStringRef(), kv.value().toTensor().to(device));
    }
    raw.load_constants(constants, /*use_inactive=*/false, /*check_full_update=*/true);
  }
  const std::vector<at::Tensor> inputs{at::randn(shape, at::TensorOptions().device(device))};
  const bool same = at::allclose(model.run(inputs).at(0), raw.run(inputs).at(0));

  std::vector<double> sel, hon, rw;
  for (int r = 0; r < rounds + 3; ++r) {  // three warm-up rounds
    const double s = per_call_us([&] { (void)model.select(inputs); }, calls * 10, false);
    const double h = per_call_us([&] { (void)model.run(inputs); }, calls, cuda);
    const double w = per_call_us([&] { (void)raw.run(inputs); }, calls, cuda);
    if (r < 3) continue;
    sel.push_back(s);
    hon.push_back(h);
    rw.push_back(w);
  }
  std::printf(
      "device %s shape %s: select %.3f us, honed::Model::run %.2f us, raw loader run %.2f us, "
      "difference %+.2f us per call (median of %d rounds of %d calls); outputs equal: %s\n",
      device.str().c_str(), argv[4], median(sel), median(hon), median(rw), median(hon) - median(rw),
      rounds, calls, same ? "yes" : "NO");
  return same ? 0 : 1;
}
