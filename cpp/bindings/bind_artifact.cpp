// cpp/bindings/bind_artifact.cpp: honed._core bindings of artifact (read_artifact, compatibility).
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "honed/artifact.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace honed::py {

void bind_artifact(nb::module_& m) {
  // Python translators run newest first: the subclass is registered after its base.
  m.attr("ARTIFACT_FORMAT_VERSION") = kArtifactFormatVersion;
  nb::object base = nb::exception<ArtifactError>(m, "ArtifactError");
  nb::exception<IncompatibleArtifactError>(m, "IncompatibleArtifactError", base);
  m.def(
      "read_artifact",
      [](const std::string& path) {
        Artifact a;
        {
          nb::gil_scoped_release unlocked;
          a = read_artifact(path);
        }
        nb::dict entries;
        for (const auto& [name, data] : a.entries) {
          entries[name.c_str()] = nb::bytes(data.data(), data.size());
        }
        return nb::make_tuple(a.manifest_json, entries);
      },
      "path"_a,
      "(manifest JSON, {entry: bytes}) of a verified .honed file; raises ArtifactError or "
      "IncompatibleArtifactError");
  m.def(
      "artifact_incompatibility",
      [](const std::string& manifest_json, const std::string& torch, bool cuda_available,
         const std::string& gpu, const std::string& compute_capability) {
        Artifact a = parse_manifest(manifest_json);
        return incompatibility(a.environment, a.has_payload(),
                               HostEnvironment{torch, cuda_available, gpu, compute_capability});
      },
      "manifest_json"_a, "torch"_a, "cuda_available"_a, "gpu"_a = "", "compute_capability"_a = "",
      "Why the artifact cannot run here as it is ('' when it can)");
}

}  // namespace honed::py
