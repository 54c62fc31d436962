// A value or an error message: the recoverable-error return type of every fallible call that
// crosses a component boundary (Result<void> for calls with nothing to return). Exceptions
// stay inside a component and never cross a thread.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace endpointd {

struct Error {
  std::string message;
};

template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Error e) : v_(std::move(e)) {}      // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  const std::string& error() const { return std::get<1>(v_).message; }

 private:
  std::variant<T, Error> v_;
};

// Success, or an error message.
template <>
class Result<void> {
 public:
  Result() = default;
  Result(Error e) : error_(std::move(e.message)), failed_(true) {}  // NOLINT
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
  bool failed_ = false;
};

using Status = Result<void>;

// An error message with a prefix naming where it came from ("DNS: ...").
inline Error prefixed(std::string_view prefix, const std::string& message) {
  return Error{std::string(prefix) + ": " + message};
}

}  // namespace endpointd
