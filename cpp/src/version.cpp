// cpp/src/version.cpp: the engine's version string.
#include "honed/version.h"

namespace honed {
const char* version() { return "0.1.0"; }
}  // namespace honed
