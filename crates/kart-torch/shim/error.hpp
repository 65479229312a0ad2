// Turns a C++ exception into the shim's error string.
#pragma once
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include <c10/util/Exception.h>

namespace kart {

inline char* error(const std::string& message) {
  char* out = static_cast<char*>(std::malloc(message.size() + 1));
  std::memcpy(out, message.c_str(), message.size() + 1);
  return out;
}

// Runs `body`; an exception becomes its message (a c10::Error's without its C++ backtrace).
template <typename F>
char* guarded(F&& body) {
  try {
    body();
    return nullptr;
  } catch (const c10::Error& e) {
    return error(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return error(e.what());
  } catch (...) {
    return error("unknown C++ exception");
  }
}

inline char* copy(const std::string& s) { return error(s); }

}  // namespace kart
