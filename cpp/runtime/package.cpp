// cpp/runtime/package.cpp: an AOTInductor package loaded from its bytes in the artifact.
#include "package.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "constants.h"
#include "honed/runtime.h"

namespace honed::detail {
namespace {

// Where torch's package writer puts the files of the model named "model" (the only one honed
// compiles) and its separately stored constants, inside the archive's top-level folder.
constexpr std::string_view kModelDir = "data/aotinductor/model/";
constexpr std::string_view kConstantsDir = "data/constants/";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

uint16_t le16(std::string_view b, size_t at) {
  return static_cast<uint16_t>(static_cast<unsigned char>(b[at]) |
                               (static_cast<unsigned char>(b[at + 1]) << 8));
}

// Empty, absolute, or with an empty, "." or ".." component.
bool unsafe_path(std::string_view name) {
  if (name.empty() || name.front() == '/' || name.back() == '/') return true;
  size_t start = 0;
  for (;;) {
    size_t slash = name.find('/', start);
    std::string_view part =
        name.substr(start, slash == std::string_view::npos ? slash : slash - start);
    if (part.empty() || part == "." || part == "..") return true;
    if (slash == std::string_view::npos) return false;
    start = slash + 1;
  }
}

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// POSIX calls, not std::filesystem: the libtorch.so of torch 2.11's CUDA wheels exports its own
// std::filesystem functions, which the dynamic linker picks over libstdc++'s, and its remove_all
// jumped to address 0 (found on the H100).
std::string make_private_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  std::string dir = base + "/honed-runtime-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    throw RuntimeError("honed runtime: cannot create a temporary folder in " + base + " (" +
                       std::strerror(errno) + "); set TMPDIR to a writable folder");
  }
  return dir;
}

void write_file(const std::string& path, std::string_view data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw RuntimeError("honed runtime: cannot create " + path + " (" + std::strerror(errno) +
                       "); set TMPDIR to a writable folder");
  }
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      throw RuntimeError("honed runtime: writing " + path + " failed (" + std::strerror(err) +
                         "); free space in TMPDIR or point it elsewhere");
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    throw RuntimeError("honed runtime: writing " + path + " failed (" + std::strerror(errno) + ")");
  }
}

// One file of the package: its name below the model folder and its bytes in the mapping.
struct PackageFile {
  std::string name;
  std::string_view data;
};

// The files of the package's model folder and its constants folder, as views into `pt2`. torch's
// own reader (PyTorchStreamReader) reads the archive's directory; the bytes are not copied.
std::vector<PackageFile> package_files(std::string_view pt2) {
  auto adapter = std::make_shared<caffe2::serialize::MemoryReadAdapter>(
      pt2.data(), static_cast<off_t>(pt2.size()));
  caffe2::serialize::PyTorchStreamReader reader(adapter);
  std::vector<PackageFile> files;
  for (const std::string& record : reader.getAllRecords()) {
    std::string_view dir = record.rfind(kModelDir, 0) == 0       ? kModelDir
                           : record.rfind(kConstantsDir, 0) == 0 ? kConstantsDir
                                                                 : std::string_view();
    if (dir.empty() || ends_with(record, ".cpp")) continue;  // sources: the .so is compiled
    // Below the model folder as stored (the container finds kernel binaries relative to it);
    // constants by their file name, beside the library, as torch's loader puts them.
    std::string name = record.substr(dir.size());
    if (dir == kConstantsDir) name = name.substr(name.rfind('/') + 1);
    if (unsafe_path(name)) {
      throw RuntimeError("honed runtime: the AOTInductor package holds '" + record +
                         "', a name torch never writes; the artifact is crafted: refused");
    }
    const size_t header = reader.getRecordHeaderOffset(record);
    const size_t offset = reader.getRecordOffset(record);
    const size_t size = reader.getRecordSize(record);
    if (header + 10 > pt2.size() || offset > pt2.size() || size > pt2.size() - offset) {
      throw RuntimeError("honed runtime: the AOTInductor package's entry '" + record +
                         "' lies outside the package; the artifact is damaged: re-save it");
    }
    if (le16(pt2, header + 8) != 0) {  // the local header's compression method: 0 = stored
      throw RuntimeError("honed runtime: the AOTInductor package's entry '" + record +
                         "' is compressed; torch stores them uncompressed: re-save the artifact");
    }
    files.push_back(PackageFile{std::move(name), pt2.substr(offset, size)});
  }
  return files;
}

std::string device_key(const std::vector<PackageFile>& files) {
  for (const PackageFile& f : files) {
    if (!ends_with(f.name, "_metadata.json")) continue;
    nlohmann::json metadata = nlohmann::json::parse(f.data, nullptr, false);
    if (metadata.is_object() && metadata.contains("AOTI_DEVICE_KEY")) {
      return metadata["AOTI_DEVICE_KEY"].get<std::string>();
    }
  }
  throw RuntimeError(
      "honed runtime: the AOTInductor package has no metadata naming its device; re-tune with "
      "this honed");
}

}  // namespace

Package::Package(std::string_view pt2, const c10::Device& device, int runners,
                 bool single_threaded) {
  auto start = std::chrono::steady_clock::now();
  std::vector<PackageFile> files;
  try {
    files = package_files(pt2);
  } catch (const c10::Error& e) {
    throw RuntimeError(std::string("honed runtime: the AOTInductor package is not readable (") +
                       e.what_without_backtrace() + "); re-save the artifact");
  }
  const std::string key = device_key(files);
  auto& registry = torch::inductor::getAOTIModelRunnerRegistry();
  if (registry.find(key) == registry.end()) {
    throw RuntimeError("honed runtime: the AOTInductor package runs on '" + key +
                       "', which this libtorch cannot run (is it a CPU-only build?)");
  }
  dir_ = make_private_dir();
  std::string library, blob;
  try {
    for (const PackageFile& f : files) {
      const std::string path = dir_ + "/" + f.name;
      for (size_t slash = f.name.find('/'); slash != std::string::npos;
           slash = f.name.find('/', slash + 1)) {
        const std::string sub = dir_ + "/" + f.name.substr(0, slash);
        if (::mkdir(sub.c_str(), 0700) == 0) {
          subdirs_.push_back(sub);
        } else if (errno != EEXIST) {
          throw RuntimeError("honed runtime: cannot create " + sub + " (" + std::strerror(errno) +
                             ")");
        }
      }
      write_file(path, f.data);
      written_bytes_ += f.data.size();
      kept_.push_back(path);
      if (ends_with(f.name, ".so")) library = path;
      if (ends_with(f.name, ".blob")) blob = path;
    }
    if (library.empty()) {
      throw RuntimeError(
          "honed runtime: the AOTInductor package holds no compiled library (.so); re-tune "
          "with this honed");
    }
    write_seconds_ = since(start);
    start = std::chrono::steady_clock::now();
    c10::Device where = device;
    if (where.is_cuda() && !where.has_index()) where.set_index(0);
    runner_ = registry[key](library, static_cast<size_t>(std::max(runners, 1)), where.str(), dir_,
                            single_threaded);
    if (!blob.empty()) runner_->update_constant_buffer_from_blob(blob);
    open_seconds_ = since(start);
  } catch (...) {
    runner_.reset();
    remove_files();
    throw;
  }
  // Loaded: the mapping stays after the name goes. Kernel binaries stay until the destructor, as
  // AOTInductor loads each on its kernel's first launch.
  ::unlink(library.c_str());
}

Package::~Package() {
  runner_.reset();  // dlclose before the folder goes
  remove_files();
}

void Package::remove_files() {
  for (const std::string& path : kept_) ::unlink(path.c_str());
  for (auto it = subdirs_.rbegin(); it != subdirs_.rend(); ++it) ::rmdir(it->c_str());
  ::rmdir(dir_.c_str());
}

size_t Package::give_constants(std::string_view listing, std::string_view weights,
                               std::string_view stored, const c10::Device& device) {
  constants_ = detail::give_constants(*runner_, listing, weights, stored, device);
  size_t bytes = 0;
  for (const at::Tensor& t : constants_) bytes += static_cast<size_t>(t.nbytes());
  return bytes;
}

std::vector<at::Tensor> Package::run(const std::vector<at::Tensor>& inputs,
                                     void* cuda_stream) const {
  return runner_->run(inputs, cuda_stream);
}

}  // namespace honed::detail
