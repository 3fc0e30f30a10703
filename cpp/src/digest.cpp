// cpp/src/digest.cpp: honed::Sha256, hashing host bytes in place and GPU bytes through pinned
// staging, without a Python or torch call (digest.h).
#include "honed/digest.h"

#include <openssl/evp.h>

#include <algorithm>
#include <stdexcept>

#include "cuda_copy.h"

namespace honed {

struct Sha256::Impl {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md{EVP_MD_CTX_new(), EVP_MD_CTX_free};
  bool finished = false;

  void add(const void* data, size_t size) {
    if (size && EVP_DigestUpdate(md.get(), data, size) != 1) {
      throw std::runtime_error("OpenSSL EVP_DigestUpdate(SHA-256) failed");
    }
  }
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  if (!impl_->md || EVP_DigestInit_ex(impl_->md.get(), EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("OpenSSL EVP_DigestInit(SHA-256) failed");
  }
}

Sha256::~Sha256() = default;

namespace {

// GPU pieces packed into one staging half until it is full, then waited for and hashed while
// the next half fills: one stream synchronize per half, however small the pieces.
class Staging {
 public:
  Staging(const DeviceCopy& copy, Sha256& hash)
      : copy_(copy), hash_(hash), half_(copy.staging_size / 2) {}

  void add(uintptr_t address, size_t size) {
    if (!copy_.staging || half_ == 0) {
      throw std::invalid_argument(
          "Sha256.update: a GPU part needs a pinned staging buffer (staging, staging_size)");
    }
    while (size) {
      if (filled_ == half_) switch_halves();
      const size_t take = std::min(size, half_ - filled_);
      detail::cuda_copy_to_host_async(base(current_) + filled_, address, take, copy_.stream);
      filled_ += take;
      address += take;
      size -= take;
    }
  }

  // Everything copied so far, hashed (before a host part, and at the end).
  void drain() {
    switch_halves();
    hash_pending();
  }

 private:
  unsigned char* base(int half) const {
    return reinterpret_cast<unsigned char*>(copy_.staging) + static_cast<size_t>(half) * half_;
  }

  // The half being filled becomes the pending one: the previous pending half is hashed while
  // its copies run, then they are waited for.
  void switch_halves() {
    if (!filled_) return;
    hash_pending();
    detail::cuda_stream_synchronize(copy_.stream);
    pending_ = filled_;
    filled_ = 0;
    current_ ^= 1;
  }

  void hash_pending() {
    hash_.update(base(current_ ^ 1), pending_);
    pending_ = 0;
  }

  DeviceCopy copy_;
  Sha256& hash_;
  size_t half_;
  int current_ = 0;     // the half being filled
  size_t filled_ = 0;   // bytes queued into it
  size_t pending_ = 0;  // bytes waiting in the other half
};

}  // namespace

void Sha256::update(const std::vector<DigestPart>& parts, const DeviceCopy& copy) {
  if (impl_->finished) throw std::logic_error("Sha256.update after hexdigest()");
  Staging staging(copy, *this);
  for (const DigestPart& part : parts) {
    if (part.device) {
      staging.add(part.address, part.size);
      continue;
    }
    staging.drain();
    if (part.address) {
      impl_->add(reinterpret_cast<const void*>(part.address), part.size);
    } else {
      impl_->add(part.bytes.data(), part.bytes.size());
    }
  }
  staging.drain();
}

void Sha256::update(const void* data, size_t size) {
  if (impl_->finished) throw std::logic_error("Sha256.update after hexdigest()");
  impl_->add(data, size);
}

std::string Sha256::hexdigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (impl_->finished || EVP_DigestFinal_ex(impl_->md.get(), digest, &len) != 1) {
    throw std::logic_error("Sha256.hexdigest: called twice, or OpenSSL's finalization failed");
  }
  impl_->finished = true;
  static const char* hex = "0123456789abcdef";
  std::string out(2 * len, '0');
  for (unsigned int i = 0; i < len; ++i) {
    out[2 * i] = hex[digest[i] >> 4];
    out[2 * i + 1] = hex[digest[i] & 0xf];
  }
  return out;
}

}  // namespace honed
