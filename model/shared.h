// Immutable values that every copy shares: a merged endpoint in a snapshot points at the same
// port list and pod reference as the slice it came from, instead of holding copies of them
// (at 100k endpoints the copies were a third of the snapshot). They read like the
// std::optional / std::vector they replace; writing through one makes a new value, so a copy
// never sees another's change.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace endpointd::model {

// An optional T behind a shared pointer: null when absent.
template <typename T>
class Shared {
 public:
  Shared() = default;
  Shared(std::nullopt_t) {}  // NOLINT: implicit on purpose
  Shared(T value) : p_(std::make_shared<const T>(std::move(value))) {}  // NOLINT
  Shared(const std::optional<T>& value) {                               // NOLINT
    if (value) p_ = std::make_shared<const T>(*value);
  }

  bool has_value() const { return p_ != nullptr; }
  explicit operator bool() const { return has_value(); }
  const T& operator*() const { return *p_; }
  const T* operator->() const { return p_.get(); }
  const T& value() const { return *p_; }
  void reset() { p_.reset(); }

  // By value; the pointer comparison is a shortcut only.
  friend bool operator==(const Shared& a, const Shared& b) {
    if (a.p_ == b.p_) return true;
    return a.p_ && b.p_ && *a.p_ == *b.p_;
  }
  friend bool operator==(const Shared& a, std::nullopt_t) { return !a.p_; }

 private:
  std::shared_ptr<const T> p_;
};

// A vector of T behind a shared pointer: null when empty. push_back copies the elements into
// a new vector (it is meant for lists that are built once and then only read).
template <typename T>
class SharedVector {
 public:
  using value_type = T;
  using const_iterator = typename std::vector<T>::const_iterator;
  using iterator = const_iterator;

  SharedVector() = default;
  SharedVector(std::vector<T> items) {  // NOLINT: implicit on purpose
    if (!items.empty()) p_ = std::make_shared<const std::vector<T>>(std::move(items));
  }
  SharedVector(std::initializer_list<T> items) : SharedVector(std::vector<T>(items)) {}

  const_iterator begin() const { return vec().begin(); }
  const_iterator end() const { return vec().end(); }
  size_t size() const { return p_ ? p_->size() : 0; }
  bool empty() const { return size() == 0; }
  const T& operator[](size_t i) const { return (*p_)[i]; }
  const T& front() const { return p_->front(); }
  const T& back() const { return p_->back(); }
  const std::vector<T>& vec() const { return p_ ? *p_ : empty_vector(); }

  void push_back(T item) {
    std::vector<T> next;
    next.reserve(size() + 1);
    next.assign(begin(), end());
    next.push_back(std::move(item));
    p_ = std::make_shared<const std::vector<T>>(std::move(next));
  }
  void clear() { p_.reset(); }

  friend bool operator==(const SharedVector& a, const SharedVector& b) {
    return a.p_ == b.p_ || a.vec() == b.vec();
  }
  friend bool operator==(const SharedVector& a, const std::vector<T>& b) { return a.vec() == b; }

 private:
  static const std::vector<T>& empty_vector() {
    static const std::vector<T> empty;
    return empty;
  }
  std::shared_ptr<const std::vector<T>> p_;
};

}  // namespace endpointd::model
