// Status names and the file:line decoration used by the check macros.
#include "seqpar/status.hpp"

#include <cstring>

namespace seqpar {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kCommError: return "communication error";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

namespace detail {
std::string located(const char* file, int line, const std::string& message) {
  // Keep the path from "src/" or "include/" on so messages stay short but findable.
  const char* shown = file;
  for (const char* marker : {"/src/", "/include/", "/apps/"}) {
    if (const char* p = std::strstr(file, marker)) {
      shown = p + 1;
      break;
    }
  }
  return message + " [" + shown + ":" + std::to_string(line) + "]";
}
}  // namespace detail

}  // namespace seqpar
