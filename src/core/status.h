// Status and Result<T>: recoverable errors (I/O, bad config, bad input) travel
// as values. Messages name the operation and the offending thing (file, line,
// tensor, key) so a user can act on them. Invariants use LATHE_CHECK instead.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <variant>

namespace lathe {

enum class StatusCode : uint8_t {
  kOk,
  kInvalidArgument,  // bad input from the user: flags, files, requests
  kNotFound,
  kIoError,
  kUnsupported,
  kOutOfMemory,
  kInternal,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "<context>: <message>".
  Status with_context(const std::string& context) const {
    if (is_ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Builds a message from streamable parts: error(kIoError, "open ", path, ": ", why).
template <class... Parts>
Status error(StatusCode code, const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return Status(code, os.str());
}
template <class... Parts>
Status invalid_argument(const Parts&... parts) {
  return error(StatusCode::kInvalidArgument, parts...);
}
template <class... Parts>
Status io_error(const Parts&... parts) {
  return error(StatusCode::kIoError, parts...);
}
template <class... Parts>
Status not_found(const Parts&... parts) {
  return error(StatusCode::kNotFound, parts...);
}
template <class... Parts>
Status unsupported(const Parts&... parts) {
  return error(StatusCode::kUnsupported, parts...);
}

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).is_ok()) v_ = Status(StatusCode::kInternal, "Result built from an ok Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

namespace detail {
inline Status to_status(Status s) { return s; }
template <class T>
Status to_status(const Result<T>& r) { return r.status(); }
}  // namespace detail

}  // namespace lathe

#define LATHE_CONCAT_INNER(a, b) a##b
#define LATHE_CONCAT(a, b) LATHE_CONCAT_INNER(a, b)

// LATHE_TRY(expr): return the Status of expr from the enclosing function if it failed.
#define LATHE_TRY(expr)                                                       \
  do {                                                                        \
    ::lathe::Status lathe_try_status_ = ::lathe::detail::to_status((expr));   \
    if (!lathe_try_status_.is_ok()) return lathe_try_status_;                 \
  } while (0)

// LATHE_ASSIGN_OR_RETURN(lhs, expr): lhs = value of the Result expr, or return its Status.
#define LATHE_ASSIGN_OR_RETURN(lhs, expr) \
  LATHE_ASSIGN_OR_RETURN_IMPL(LATHE_CONCAT(lathe_result_, __LINE__), lhs, expr)
#define LATHE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.is_ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
