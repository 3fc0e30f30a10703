// cpp/include/honed/version.h: the engine's version string.
#pragma once

namespace honed {
const char* version();
}  // namespace honed
