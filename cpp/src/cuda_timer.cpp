// cpp/src/cuda_timer.cpp: CudaEventTimer over the CUDA runtime or driver API, loaded with dlopen,
// and the copies to the host that honed::Sha256 makes of GPU memory (cuda_copy.h).
// No CUDA headers: the few entry points are declared here. cudaError_t and CUresult are C enums
// (int-sized, 0 = success); cudaEvent_t/CUevent and cudaStream_t/CUstream are opaque pointers, and
// a cudaStream_t is a CUstream, so one stream handle serves both APIs.
#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_copy.h"
#include "dynlib.h"
#include "honed/measure.h"

namespace honed {

namespace {

using status_t = int;  // cudaError_t / CUresult
using event_t = void*;
using stream_t = void*;

// The entry points the timer needs, from either API (same shapes for both):
//   cudaEventCreateWithFlags(cudaEvent_t*, unsigned) / cuEventCreate(CUevent*, unsigned)
//   cudaEventRecord(cudaEvent_t, cudaStream_t)       / cuEventRecord(CUevent, CUstream)
//   cudaEventSynchronize(cudaEvent_t)                / cuEventSynchronize(CUevent)
//   cudaEventElapsedTime(float*, start, end)         / cuEventElapsedTime(float*, start, end)
//   cudaEventDestroy(cudaEvent_t)                    / cuEventDestroy_v2(CUevent)
struct CudaApi {
  bool ok = false;
  bool driver = false;
  std::string what;  // the library in use, or why none could be used
  status_t (*event_create)(event_t*, unsigned) = nullptr;
  status_t (*event_record)(event_t, stream_t) = nullptr;
  status_t (*event_synchronize)(event_t) = nullptr;
  status_t (*event_elapsed)(float*, event_t, event_t) = nullptr;
  status_t (*event_destroy)(event_t) = nullptr;
  const char* (*runtime_error_string)(status_t) = nullptr;            // cudaGetErrorString
  status_t (*driver_error_string)(status_t, const char**) = nullptr;  // cuGetErrorString
  status_t (*driver_init)(unsigned) = nullptr;                        // cuInit
  status_t (*driver_current_context)(void**) = nullptr;               // cuCtxGetCurrent
  // For cuda_copy.h, optional (the timer does without them):
  //   cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream) / cuMemcpyDtoHAsync_v2(dst,
  //   CUdeviceptr src, n, stream)
  status_t (*runtime_copy)(void*, const void*, size_t, int, stream_t) = nullptr;
  status_t (*driver_copy)(void*, unsigned long long, size_t, stream_t) = nullptr;
};

using detail::resolve;

bool resolve_runtime(void* h, CudaApi& api) {
  return resolve(h, {"cudaEventCreateWithFlags"}, api.event_create) &&
         resolve(h, {"cudaEventRecord"}, api.event_record) &&
         resolve(h, {"cudaEventSynchronize"}, api.event_synchronize) &&
         resolve(h, {"cudaEventElapsedTime", "cudaEventElapsedTime_v2"}, api.event_elapsed) &&
         resolve(h, {"cudaEventDestroy"}, api.event_destroy) &&
         resolve(h, {"cudaGetErrorString"}, api.runtime_error_string);
}

// The optional entry points (cuda_copy.h): left null where the library lacks them.
void resolve_copies(void* h, CudaApi& api) {
  if (api.driver) {
    resolve(h, {"cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync"}, api.driver_copy);
  } else {
    resolve(h, {"cudaMemcpyAsync"}, api.runtime_copy);
  }
}

bool resolve_driver(void* h, CudaApi& api) {
  // cuda.h maps cuEventDestroy to cuEventDestroy_v2; cuEventElapsedTime_v2 exists from 12.8 on.
  return resolve(h, {"cuInit"}, api.driver_init) &&
         resolve(h, {"cuCtxGetCurrent"}, api.driver_current_context) &&
         resolve(h, {"cuEventCreate"}, api.event_create) &&
         resolve(h, {"cuEventRecord"}, api.event_record) &&
         resolve(h, {"cuEventSynchronize"}, api.event_synchronize) &&
         resolve(h, {"cuEventElapsedTime", "cuEventElapsedTime_v2"}, api.event_elapsed) &&
         resolve(h, {"cuEventDestroy_v2", "cuEventDestroy"}, api.event_destroy) &&
         resolve(h, {"cuGetErrorString"}, api.driver_error_string);
}

std::string last_dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

// The runtime already in the process first (the one torch uses), then a fresh load of a runtime,
// then the driver. Libraries are never closed: the API stays valid for the life of the process.
CudaApi load_api() {
  // CUDA 11's runtime soname is libcudart.so.11.0; ".11" is tried as well for odd installs.
  const std::vector<const char*> runtimes = {"libcudart.so.13", "libcudart.so.12",
                                             "libcudart.so.11.0", "libcudart.so.11"};
  std::string errors;
  for (const int mode : {RTLD_NOW | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
    for (const char* name : runtimes) {
      void* h = dlopen(name, mode);
      if (!h) {
        if (!(mode & RTLD_NOLOAD)) errors += std::string(" ") + name + ": " + last_dl_error() + ";";
        continue;
      }
      CudaApi api;
      if (resolve_runtime(h, api)) {
        resolve_copies(h, api);
        api.ok = true;
        api.what = std::string(name) + ((mode & RTLD_NOLOAD) ? " (already loaded)" : " (loaded)");
        return api;
      }
      errors += std::string(" ") + name + ": missing event entry points;";
    }
  }
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    errors += std::string(" libcuda.so.1: ") + last_dl_error();
  } else {
    CudaApi api;
    if (resolve_driver(h, api)) {
      api.ok = true;
      api.driver = true;
      resolve_copies(h, api);
      api.what = "libcuda.so.1 (driver API)";
      return api;
    }
    errors += " libcuda.so.1: missing event entry points";
  }
  CudaApi none;
  none.what = "no CUDA runtime or driver library could be loaded:" + errors +
              " (no NVIDIA driver/CUDA here? time on the host with HostTimer instead)";
  return none;
}

const CudaApi& cuda_api() {
  static const CudaApi api = load_api();
  return api;
}

std::string error_text(const CudaApi& api, status_t status) {
  const char* text = nullptr;
  if (api.runtime_error_string) text = api.runtime_error_string(status);
  if (api.driver_error_string && api.driver_error_string(status, &text) != 0) text = nullptr;
  return std::string(text ? text : "unknown error") + " (code " + std::to_string(status) + ")";
}

void check(const CudaApi& api, status_t status, const char* call) {
  if (status != 0) {
    throw std::runtime_error(std::string("CudaEventTimer: ") + call +
                             " failed: " + error_text(api, status) + " [" + api.what + "]");
  }
}

// The driver API works on the calling thread's current context; the runtime makes one itself.
void require_driver_context(const CudaApi& api) {
  check(api, api.driver_init(0), "cuInit");
  void* context = nullptr;
  check(api, api.driver_current_context(&context), "cuCtxGetCurrent");
  if (!context) {
    throw std::runtime_error(
        "CudaEventTimer: no current CUDA context on this thread (driver API fallback, " + api.what +
        "); initialize CUDA first (e.g. torch.cuda.init()) or make libcudart loadable");
  }
}

double steady_now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

struct CudaEventTimer::Impl {
  const CudaApi* api = nullptr;
  stream_t stream = nullptr;
  event_t start = nullptr;
  event_t end = nullptr;

  ~Impl() {
    // Errors are ignored here: a destructor cannot report them and the events are gone either way.
    if (start) api->event_destroy(start);
    if (end) api->event_destroy(end);
  }
};

CudaEventTimer::CudaEventTimer(uintptr_t stream) : impl_(std::make_unique<Impl>()) {
  const CudaApi& api = cuda_api();
  if (!api.ok) throw std::runtime_error("CudaEventTimer unavailable: " + api.what);
  impl_->api = &api;
  impl_->stream = reinterpret_cast<stream_t>(stream);
  if (api.driver) require_driver_context(api);
  // Flags 0 = cudaEventDefault / CU_EVENT_DEFAULT: timing enabled (never DisableTiming).
  check(api, api.event_create(&impl_->start, 0), "event create");
  check(api, api.event_create(&impl_->end, 0), "event create");
}

CudaEventTimer::~CudaEventTimer() = default;

double CudaEventTimer::time_ms(const std::function<void()>& fn) {
  const CudaApi& api = *impl_->api;
  const double host_start = steady_now_ms();
  check(api, api.event_record(impl_->start, impl_->stream), "event record (start)");
  fn();
  check(api, api.event_record(impl_->end, impl_->stream), "event record (end)");
  check(api, api.event_synchronize(impl_->end), "event synchronize");
  last_host_ms_ = steady_now_ms() - host_start;
  float ms = 0;
  check(api, api.event_elapsed(&ms, impl_->start, impl_->end), "event elapsed time");
  return static_cast<double>(ms);
}

double CudaEventTimer::now_ms() { return steady_now_ms(); }

std::string CudaEventTimer::backend() const { return impl_->api->what; }

std::pair<bool, std::string> cuda_timer_available() {
  const CudaApi& api = cuda_api();
  if (!api.ok) return {false, api.what};
  try {
    CudaEventTimer probe(0);  // creates and destroys two events: proves a device and context
    return {true, api.what};
  } catch (const std::runtime_error& e) {
    return {false, e.what()};
  }
}

namespace detail {

namespace {
const CudaApi& copy_api() {
  const CudaApi& api = cuda_api();
  if (!api.ok || !(api.runtime_copy || api.driver_copy)) {
    throw std::runtime_error("copying GPU memory to the host: " +
                             (api.ok ? api.what + " lacks the copy entry points" : api.what));
  }
  if (api.driver) require_driver_context(api);
  return api;
}

void check_copy(const CudaApi& api, status_t status, const char* call) {
  if (status != 0) {
    throw std::runtime_error(std::string("copying GPU memory to the host: ") + call +
                             " failed: " + error_text(api, status) + " [" + api.what + "]");
  }
}
}  // namespace

void cuda_copy_to_host_async(void* dst, uintptr_t src, size_t size, uintptr_t stream) {
  const CudaApi& api = copy_api();
  constexpr int kDeviceToHost = 2;  // cudaMemcpyDeviceToHost
  const auto s = reinterpret_cast<stream_t>(stream);
  if (api.runtime_copy) {
    check_copy(api,
               api.runtime_copy(dst, reinterpret_cast<const void*>(src), size, kDeviceToHost, s),
               "cudaMemcpyAsync");
  } else {
    check_copy(api, api.driver_copy(dst, src, size, s), "cuMemcpyDtoHAsync");
  }
}

void cuda_stream_synchronize(uintptr_t stream) {
  const CudaApi& api = copy_api();
  // An event that blocks its waiter (cudaEventBlockingSync | cudaEventDisableTiming, the driver's
  // flags have the same values): a stream synchronize in a process whose context spins would keep
  // polling the driver from this thread beside the program's own launches.
  constexpr unsigned kBlockingUntimed = 0x1 | 0x2;
  event_t done = nullptr;
  check_copy(api, api.event_create(&done, kBlockingUntimed), "event create");
  status_t status = api.event_record(done, reinterpret_cast<stream_t>(stream));
  if (status == 0) status = api.event_synchronize(done);
  api.event_destroy(done);
  check_copy(api, status, "event synchronize");
}

}  // namespace detail

}  // namespace honed
