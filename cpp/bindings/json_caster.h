// cpp/bindings/json_caster.h: nlohmann::json <-> Python objects (dict, list, str, int, float, bool,
// None).
#pragma once

#include <nanobind/nanobind.h>

#include <nlohmann/json.hpp>
#include <string>

namespace honed::py {

nanobind::object json_to_python(const nlohmann::json& j);
nlohmann::json json_from_python(nanobind::handle obj);  // throws nb::type_error on other types

}  // namespace honed::py

namespace nanobind::detail {

template <>
struct type_caster<nlohmann::json> {
  NB_TYPE_CASTER(nlohmann::json, const_name("typing.Any"))

  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    try {
      value = honed::py::json_from_python(src);
      return true;
    } catch (...) {
      return false;
    }
  }

  static handle from_cpp(const nlohmann::json& j, rv_policy, cleanup_list*) noexcept {
    try {
      return honed::py::json_to_python(j).release();
    } catch (...) {
      return handle();
    }
  }
};

}  // namespace nanobind::detail
