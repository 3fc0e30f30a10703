// examples/cpp/main.cpp: load a .honed artifact, run its stored sample, print (and save) outputs.
//   honed_example MODEL.honed [DEVICE] [OUTPUTS.json]
//   honed_example --docs-fragment   (runs the fragment of docs/cpp.md on ./model.honed, on CPU)
#include <honed/runtime.h>
#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <iostream>

// docs/cpp.md, "Use it from your program", line for line (tests/test_runtime_cpp.py checks that
// every line of that block is here, and runs this).
static std::vector<torch::Tensor> docs_fragment() {
  honed::Model model("model.honed", torch::kCPU);  // or torch::Device("cuda:0")
  std::vector<torch::Tensor> outputs = model.run({torch::randn({8, 16})});
  return outputs;
}

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--docs-fragment") == 0) {
    try {
      std::cout << "docs fragment: output 0: " << docs_fragment().at(0).sizes() << "\n";
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "honed_example: " << e.what() << "\n";
      return 1;
    }
  }
  if (argc < 2) {
    std::cerr << "usage: honed_example MODEL.honed [cpu|cuda] [OUTPUTS.json]\n";
    return 2;
  }
  const torch::Device device(argc > 2 ? argv[2] : "cpu");
  try {
    honed::Model model(argv[1], device);  // verifies hashes and environment, loads the graphs
    std::cout << "loaded " << model.module_name() << " in " << model.load_seconds() << " s\n";

    // Any inputs inside the tuned profile work; here: the sample stored in the artifact.
    std::vector<torch::Tensor> inputs = model.samples().at(0).inputs;
    std::vector<torch::Tensor> outputs = model.run(inputs);

    std::ofstream json(argc > 3 ? argv[3] : "/dev/null");
    json << "[";
    for (size_t i = 0; i < outputs.size(); ++i) {
      torch::Tensor out = outputs[i].to(torch::kCPU, torch::kDouble).contiguous();
      std::cout << "output " << i << ": " << out.sizes() << "\n";
      json << (i ? "," : "") << "{\"shape\":" << out.sizes() << ",\"values\":[";
      const double* v = out.data_ptr<double>();
      json.precision(17);
      for (int64_t k = 0; k < out.numel(); ++k) json << (k ? "," : "") << v[k];
      json << "]}";
    }
    json << "]\n";
  } catch (const std::exception& e) {
    std::cerr << "honed_example: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
