# cmake/HonedLibzip.cmake: the imported target honed::libzip.
# Searched in CMAKE_PREFIX_PATH (e.g. $PWD/.deps/usr from scripts/fetch-device-deps.sh, on machines
# without a libzip package) and the system. zipconf.h lives in the multiarch include folder on
# Debian and Ubuntu, so both headers are looked up.
find_path(HONED_ZIP_INCLUDE_DIR zip.h)
find_path(HONED_ZIPCONF_INCLUDE_DIR zipconf.h PATH_SUFFIXES ${CMAKE_LIBRARY_ARCHITECTURE})
find_library(HONED_ZIP_LIBRARY NAMES zip)
if(NOT HONED_ZIP_INCLUDE_DIR OR NOT HONED_ZIPCONF_INCLUDE_DIR OR NOT HONED_ZIP_LIBRARY)
  message(FATAL_ERROR
    "libzip not found (zip.h: ${HONED_ZIP_INCLUDE_DIR}, zipconf.h: ${HONED_ZIPCONF_INCLUDE_DIR}, "
    "library: ${HONED_ZIP_LIBRARY}). Install it (Debian/Ubuntu: apt-get install libzip-dev), or "
    "without network run scripts/fetch-device-deps.sh on a machine with apt and pass "
    "-DCMAKE_PREFIX_PATH=$PWD/.deps/usr")
endif()
message(STATUS "libzip: ${HONED_ZIP_LIBRARY}")
add_library(honed::libzip UNKNOWN IMPORTED)
set_target_properties(honed::libzip PROPERTIES
  IMPORTED_LOCATION "${HONED_ZIP_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${HONED_ZIP_INCLUDE_DIR};${HONED_ZIPCONF_INCLUDE_DIR}")
