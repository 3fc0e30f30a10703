// cpp/bindings/bind_digest.cpp: honed._core.Sha256 (digest.h), hashing with the GIL released.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include "bindings.h"
#include "honed/digest.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace honed::py {

void bind_digest(nb::module_& m) {
  nb::class_<Sha256>(m, "Sha256",
                     "SHA-256 over bytes and memory regions, GPU memory included, hashed "
                     "without the GIL (a JIT program's calls run on meanwhile)")
      .def(nb::init<>())
      .def(
          "update",
          [](Sha256& self, const nb::list& parts, uintptr_t stream, uintptr_t staging,
             size_t staging_size) {
            std::vector<DigestPart> todo;
            todo.reserve(parts.size());
            for (nb::handle part : parts) {
              if (nb::isinstance<nb::bytes>(part)) {
                const auto b = nb::borrow<nb::bytes>(part);
                todo.push_back(DigestPart{std::string(b.c_str(), b.size())});
              } else {
                auto [address, size, device] = nb::cast<std::tuple<uintptr_t, size_t, bool>>(part);
                todo.push_back(DigestPart{{}, address, size, device});
              }
            }
            nb::gil_scoped_release released;
            self.update(todo, DeviceCopy{stream, staging, staging_size});
          },
          nb::sig("def update(self, parts: list[bytes | tuple[int, int, bool]], stream: int = 0, "
                  "staging: int = 0, staging_size: int = 0) -> None"),
          "parts"_a, "stream"_a = 0, "staging"_a = 0, "staging_size"_a = 0,
          "Hash each part in order: bytes, or (address, size, device) of memory the caller keeps "
          "alive and unchanged; device memory is copied on `stream` (of the current device, "
          "waiting for its writers) through `staging`, pinned host memory of `staging_size` "
          "bytes")
      .def("hexdigest", &Sha256::hexdigest, release_gil(),
           "the digest in lower-case hex; no update after it");
}

}  // namespace honed::py
