#pragma once
// A strict little JSON syntax checker for the tests (RFC 8259 values, no extensions).
#include <cctype>
#include <string>

namespace testing_support {

class JsonChecker {
 public:
  explicit JsonChecker(const std::string& s) : s_(s) {}
  /// True when the whole text is exactly one JSON value (surrounding white space allowed).
  bool valid() {
    pos_ = 0;
    ws();
    if (!value()) return false;
    ws();
    return pos_ == s_.size();
  }

 private:
  bool value() {
    if (pos_ >= s_.size()) return false;
    const char c = s_[pos_];
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') return string();
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return number();
    return literal("true") || literal("false") || literal("null");
  }
  bool literal(const char* w) {
    const std::string t(w);
    if (s_.compare(pos_, t.size(), t) != 0) return false;
    pos_ += t.size();
    return true;
  }
  bool object() {
    ++pos_;
    ws();
    if (peek('}')) return ++pos_, true;
    for (;;) {
      ws();
      if (!string()) return false;
      ws();
      if (!peek(':')) return false;
      ++pos_;
      ws();
      if (!value()) return false;
      ws();
      if (peek(',')) { ++pos_; continue; }
      if (peek('}')) return ++pos_, true;
      return false;
    }
  }
  bool array() {
    ++pos_;
    ws();
    if (peek(']')) return ++pos_, true;
    for (;;) {
      ws();
      if (!value()) return false;
      ws();
      if (peek(',')) { ++pos_; continue; }
      if (peek(']')) return ++pos_, true;
      return false;
    }
  }
  bool string() {
    if (!peek('"')) return false;
    ++pos_;
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c == '\\') {
        if (pos_ >= s_.size()) return false;
        const char e = s_[pos_++];
        if (e == 'u') {
          for (int k = 0; k < 4; ++k)
            if (pos_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[pos_++]))) return false;
        } else if (std::string("\"\\/bfnrt").find(e) == std::string::npos) {
          return false;
        }
      }
    }
    return false;
  }
  bool number() {
    const std::size_t start = pos_;
    if (peek('-')) ++pos_;
    if (peek('0')) ++pos_;
    else if (!digits()) return false;
    if (peek('.')) { ++pos_; if (!digits()) return false; }
    if (peek('e') || peek('E')) {
      ++pos_;
      if (peek('+') || peek('-')) ++pos_;
      if (!digits()) return false;
    }
    return pos_ > start;
  }
  bool digits() {
    const std::size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    return pos_ > start;
  }
  bool peek(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  void ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  const std::string& s_;
  std::size_t pos_ = 0;
};

inline bool is_valid_json(const std::string& s) { return JsonChecker(s).valid(); }

}  // namespace testing_support
