// Status values and check macros: every library function that can fail returns a
// [[nodiscard]] Status (or StatusOr<T>); the macros add file:line to the message.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace seqpar {

enum class StatusCode { kOk = 0, kInvalidArgument, kUnsupported, kCommError, kInternal };

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or the Status explaining why there is none.
template <class T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

namespace detail {
std::string located(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace seqpar

// Builds a Status with file:line prepended.
#define SP_STATUS(code, msg) \
  ::seqpar::Status((code), ::seqpar::detail::located(__FILE__, __LINE__, (msg)))

// Returns kInvalidArgument with `msg` unless `cond` holds.
#define SP_CHECK_ARG(cond, msg)                                                 \
  do {                                                                          \
    if (!(cond)) return SP_STATUS(::seqpar::StatusCode::kInvalidArgument, msg); \
  } while (0)

// Returns kUnsupported with `msg` unless `cond` holds.
#define SP_CHECK_SUPPORTED(cond, msg)                                       \
  do {                                                                      \
    if (!(cond)) return SP_STATUS(::seqpar::StatusCode::kUnsupported, msg); \
  } while (0)

// Propagates a non-ok Status.
#define SP_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::seqpar::Status sp_status_ = (expr);        \
    if (!sp_status_.ok()) return sp_status_;     \
  } while (0)

#define SP_CONCAT_INNER(a, b) a##b
#define SP_CONCAT(a, b) SP_CONCAT_INNER(a, b)
// `SP_ASSIGN_OR_RETURN(auto x, f());` unwraps a StatusOr or propagates its Status.
#define SP_ASSIGN_OR_RETURN(lhs, expr)                        \
  auto SP_CONCAT(sp_or_, __LINE__) = (expr);                  \
  if (!SP_CONCAT(sp_or_, __LINE__).ok())                      \
    return SP_CONCAT(sp_or_, __LINE__).status();              \
  lhs = std::move(SP_CONCAT(sp_or_, __LINE__)).value()
