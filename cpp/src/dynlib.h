// cpp/src/dynlib.h: resolving entry points of a library loaded with dlopen (engine-internal).
#pragma once
#include <dlfcn.h>

#include <cstring>
#include <initializer_list>
#include <string>

namespace honed::detail {

// Resolves the first of names found in handle into out (memcpy: object to function pointer);
// false when none is there.
template <typename F>
bool resolve(void* handle, std::initializer_list<const char*> names, F& out) {
  for (const char* name : names) {
    if (void* sym = dlsym(handle, name)) {
      static_assert(sizeof(F) == sizeof(void*));
      std::memcpy(&out, &sym, sizeof(F));
      return true;
    }
  }
  return false;
}

template <typename F>
bool resolve(void* handle, const char* name, F& out) {
  return resolve(handle, {name}, out);
}

// dlerror's message, or a placeholder when it has none.
inline std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

}  // namespace honed::detail
