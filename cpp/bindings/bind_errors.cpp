// cpp/bindings/bind_errors.cpp: every C++ exception of the engine becomes a honed.errors class.
//
// The one place where engine errors cross into Python: a bad value (std::invalid_argument and its
// kin) is honed.errors.InputError (a ValueError), an artifact problem the matching ArtifactError,
// any other engine failure honed.errors.EngineError (a RuntimeError). Python errors raised inside
// callbacks pass through untouched (nanobind restores them before any translator runs).
#include <exception>
#include <new>
#include <stdexcept>
#include <typeinfo>

#include "bindings.h"
#include "honed/artifact.h"

namespace nb = nanobind;

namespace honed::py {
namespace {

// The honed.errors classes, looked up once at import and kept for the life of the process (a
// translator may run while the interpreter shuts down, after module attributes are cleared).
struct ErrorTypes {
  PyObject* input = nullptr;
  PyObject* engine = nullptr;
  PyObject* artifact = nullptr;
  PyObject* incompatible = nullptr;
  PyObject* untrusted = nullptr;
};

ErrorTypes& types() {
  static ErrorTypes t;
  return t;
}

PyObject* owned(const nb::module_& errors, const char* name) {
  return nb::object(errors.attr(name)).release().ptr();
}

void translate(const std::exception_ptr& p, void* /*payload*/) {
  const ErrorTypes& t = types();
  try {
    std::rethrow_exception(p);
  } catch (const UntrustedArtifactError& e) {
    PyErr_SetString(t.untrusted, e.what());
  } catch (const IncompatibleArtifactError& e) {
    PyErr_SetString(t.incompatible, e.what());
  } catch (const ArtifactError& e) {
    PyErr_SetString(t.artifact, e.what());
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(t.input, e.what());
  } catch (const std::domain_error& e) {
    PyErr_SetString(t.input, e.what());
  } catch (const std::length_error& e) {
    PyErr_SetString(t.input, e.what());
  } catch (const std::range_error& e) {
    PyErr_SetString(t.input, e.what());
  } catch (const std::bad_alloc&) {
    throw;  // MemoryError (nanobind's default translator)
  } catch (const std::bad_cast&) {
    throw;  // a failed nb::cast: nanobind's TypeError
  } catch (const std::out_of_range&) {
    throw;  // IndexError, which Python's sequence protocol relies on
  } catch (const std::exception& e) {
    PyErr_SetString(t.engine, e.what());
  }
}

}  // namespace

void bind_errors(nb::module_& m) {
  nb::module_ errors = nb::module_::import_("honed.errors");
  ErrorTypes& t = types();
  t.input = owned(errors, "InputError");
  t.engine = owned(errors, "EngineError");
  t.artifact = owned(errors, "ArtifactError");
  t.incompatible = owned(errors, "IncompatibleArtifactError");
  t.untrusted = owned(errors, "UntrustedArtifactError");
  nb::register_exception_translator(&translate);
  // The engine's artifact errors under their _core names, for code that catches them there.
  m.attr("ArtifactError") = nb::handle(t.artifact);
  m.attr("IncompatibleArtifactError") = nb::handle(t.incompatible);
  m.attr("UntrustedArtifactError") = nb::handle(t.untrusted);
}

}  // namespace honed::py
