// cpp/src/cuda_copy.h: copies of GPU memory to the host over the CUDA library cuda_timer.cpp
// loads (dlopen; engine-internal). Both throw std::runtime_error naming the failing call.
#pragma once
#include <cstddef>
#include <cstdint>

namespace honed::detail {

// Queues a copy of `size` bytes at GPU address `src` into host memory `dst` (pinned, for the copy
// to be asynchronous) on `stream` (a cudaStream_t of the calling thread's current device).
void cuda_copy_to_host_async(void* dst, uintptr_t src, size_t size, uintptr_t stream);

// Waits, on the calling thread alone, until all that is queued on `stream` has run.
void cuda_stream_synchronize(uintptr_t stream);

}  // namespace honed::detail
