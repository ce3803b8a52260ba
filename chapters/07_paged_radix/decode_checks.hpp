#pragma once
/// \file decode_checks.hpp
/// \brief The shape rules every paged decode checks before it runs: the head grouping and
///        the page size. Header-only, so that the C library (python/csrc/lineage_c.cu), which
///        does not link this chapter's CPU code, applies the same rules as validate()
///        (decode.cpp). Each caller words its own message.

namespace attn::ch07 {

/// At least one query head and one KV head, and a whole number of query heads per KV head
/// (GQA: query head h reads KV head h / (heads / kv_heads)).
inline bool heads_grouped(int heads, int kv_heads) {
  return heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0;
}

/// A power of two of tokens a page: a token's page and slot are a shift and a mask of its position.
inline bool page_size_power_of_two(int page_size) {
  return page_size >= 1 && (page_size & (page_size - 1)) == 0;
}

}  // namespace attn::ch07
