// scripts/diag/aoti_load.cpp: load an AOTInductor .pt2 with libtorch alone (no honed code) and run
// it once on a random input, to tell a crash of libtorch's loader from one of the honed runtime.
// usage: aoti_load PACKAGE.pt2 DEVICE_INDEX(-1 for CPU) DIM0xDIM1...
#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <iostream>
#include <sstream>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: aoti_load PACKAGE DEVICE_INDEX SHAPE\n";
    return 2;
  }
  int index = std::stoi(argv[2]);
  std::vector<int64_t> shape;
  std::stringstream ss(argv[3]);
  for (std::string d; std::getline(ss, d, 'x');) shape.push_back(std::stoll(d));
  std::cout << "constructing the loader" << std::endl;
  torch::inductor::AOTIModelPackageLoader loader(argv[1], "model", false, 1,
                                                 static_cast<c10::DeviceIndex>(index));
  std::cout << "loaded" << std::endl;
  auto options = index < 0 ? at::TensorOptions() : at::TensorOptions().device(at::kCUDA, index);
  std::vector<at::Tensor> inputs{at::randn(shape, options)};
  std::cout << "running" << std::endl;
  std::vector<at::Tensor> out = loader.run(inputs);
  std::cout << "ran: output " << out.at(0).sizes() << " sum " << out.at(0).sum().item<float>()
            << std::endl;
  return 0;
}
