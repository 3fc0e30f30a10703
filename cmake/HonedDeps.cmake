# cmake/HonedDeps.cmake: finds the build's outside dependencies up front, so a missing one stops
# the configure with one line naming the package that provides it, never a compiler error later.
#
# Each honed_require_* call records what is missing; honed_stop_if_missing() then reports every
# missing dependency at once (one line each, then one apt-get line), so a user installs them in one
# go. A new dependency is one more honed_require_* call here (or beside its target).

set(HONED_MISSING_DEPS "")
set(HONED_MISSING_DEBS "")

# honed_missing(<what> <provider> [<hint>]): what is missing and what provides it, a Debian
# package name or a sentence when no package does; the hint says what else works.
macro(honed_missing what provider)
  if("${provider}" MATCHES " ")
    set(_honed_line "${what} not found: ${provider}")
  else()
    set(_honed_line "${what} not found: install the Debian package ${provider}")
    list(APPEND HONED_MISSING_DEBS "${provider}")
  endif()
  if(NOT "${ARGN}" STREQUAL "")
    string(APPEND _honed_line " (${ARGN})")
  endif()
  list(APPEND HONED_MISSING_DEPS "${_honed_line}")
endmacro()

# honed_require_header(<var> <header> <debian package>): <var> is the folder holding <header>.
macro(honed_require_header var header deb)
  find_path(${var} ${header} ${ARGN})
  if(NOT ${var})
    honed_missing("${header}" "${deb}")
  endif()
endmacro()

# honed_require_package(<package> <debian package> [find_package arguments]): find_package, quiet.
macro(honed_require_package package deb)
  find_package(${package} ${ARGN} QUIET)
  if(NOT ${package}_FOUND)
    honed_missing("${package}" "${deb}")
  endif()
endmacro()

macro(honed_stop_if_missing)
  if(HONED_MISSING_DEPS)
    foreach(line IN LISTS HONED_MISSING_DEPS)
      message(SEND_ERROR "${line}")
    endforeach()
    list(REMOVE_DUPLICATES HONED_MISSING_DEBS)
    list(JOIN HONED_MISSING_DEBS " " _honed_debs)
    if(_honed_debs)
      message(FATAL_ERROR "missing build dependencies; on Debian/Ubuntu: apt-get install ${_honed_debs}")
    endif()
    message(FATAL_ERROR "missing build dependencies (above)")
  endif()
endmacro()

# The engine: nlohmann/json (artifact manifests), OpenSSL's libcrypto (hashes, signatures), libzip.
honed_require_header(HONED_JSON_INCLUDE_DIR nlohmann/json.hpp nlohmann-json3-dev)
honed_require_package(OpenSSL libssl-dev COMPONENTS Crypto)
include(${CMAKE_CURRENT_LIST_DIR}/HonedLibzip.cmake)

if(HONED_BUILD_PYTHON)
  find_package(Python 3.10 COMPONENTS Interpreter Development.Module QUIET)
  if(NOT Python_Interpreter_FOUND)
    honed_missing("Python >= 3.10" "python3")
  elseif(NOT Python_Development.Module_FOUND)
    honed_missing("Python.h for ${Python_EXECUTABLE}" "python3-dev")
  else()
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
      RESULT_VARIABLE _honed_nb_rc OUTPUT_VARIABLE nanobind_ROOT ERROR_QUIET
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT _honed_nb_rc EQUAL 0)
      honed_missing("nanobind for ${Python_EXECUTABLE}"
        "pip install nanobind (pip install . brings it), or pass -DPython_EXECUTABLE=<a python with it>")
    endif()
  endif()
endif()

if(HONED_BUILD_TESTS)
  honed_require_package(GTest libgtest-dev)
endif()
