# cmake/HonedLibzip.cmake: the imported target honed::libzip.
# Searched in CMAKE_PREFIX_PATH (e.g. $PWD/.deps/usr from scripts/fetch-device-deps.sh, on machines
# without a libzip package) and the system. zipconf.h lives in the multiarch include folder on
# Debian and Ubuntu, so both headers are looked up. A missing part is reported by HonedDeps.cmake.
find_path(HONED_ZIP_INCLUDE_DIR zip.h)
find_path(HONED_ZIPCONF_INCLUDE_DIR zipconf.h PATH_SUFFIXES ${CMAKE_LIBRARY_ARCHITECTURE})
find_library(HONED_ZIP_LIBRARY NAMES zip)
if(NOT HONED_ZIP_INCLUDE_DIR OR NOT HONED_ZIPCONF_INCLUDE_DIR OR NOT HONED_ZIP_LIBRARY)
  honed_missing("libzip (zip.h, zipconf.h, libzip.so)" libzip-dev
    "without apt: scripts/fetch-device-deps.sh where apt works, then -DCMAKE_PREFIX_PATH=$PWD/.deps/usr")
else()
  message(STATUS "libzip: ${HONED_ZIP_LIBRARY}")
  add_library(honed::libzip UNKNOWN IMPORTED)
  set_target_properties(honed::libzip PROPERTIES
    IMPORTED_LOCATION "${HONED_ZIP_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${HONED_ZIP_INCLUDE_DIR};${HONED_ZIPCONF_INCLUDE_DIR}")
endif()
