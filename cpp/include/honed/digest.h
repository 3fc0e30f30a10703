// cpp/include/honed/digest.h: SHA-256 over byte regions in host or GPU memory, in one call.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace honed {

// One piece of what is hashed: `bytes` when `address` is 0, else the `size` bytes at `address`,
// in host memory (read in place) or, when `device`, in GPU memory (copied to the host first).
struct DigestPart {
  std::string bytes;
  uintptr_t address = 0;
  size_t size = 0;
  bool device = false;
};

// How GPU bytes reach the hash: copies on `stream` (a cudaStream_t) into `staging`, pinned host
// memory of `staging_size` bytes used as two halves, so that one half is hashed while the next
// pieces are copied into the other. The calling thread's current device must be the one the
// addresses are on, and the stream must already wait for whatever writes them.
struct DeviceCopy {
  uintptr_t stream = 0;
  uintptr_t staging = 0;
  size_t staging_size = 0;
};

// An incremental SHA-256 (OpenSSL's EVP interface). update() reads its parts in order, as if
// each were passed to hashlib's update: the digest of a GPU region equals that of the same bytes
// on the host. It makes no Python or torch call, so a binding runs it with the GIL released.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  // Throws std::invalid_argument for a GPU part without a staging buffer and std::runtime_error
  // when a CUDA copy fails (the hash is then unusable).
  void update(const std::vector<DigestPart>& parts, const DeviceCopy& copy = {});
  // Host bytes, read in place.
  void update(const void* data, size_t size);
  // Lower-case hex of the digest of everything so far; the object cannot be updated afterwards.
  std::string hexdigest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace honed
