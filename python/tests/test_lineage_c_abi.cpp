// The C library's ABI (python/csrc/lineage_c.h) through C++, without a GPU: the version, the
// scratch sizes, and that every refused call returns a code and a message and never aborts.
// The masked forward checks its arguments before the device, so its refusals run anywhere.
// With a Hopper GPU present the device checks pass instead, and the test says so.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "lineage_c.h"

namespace {

bool have_device() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
}

}  // namespace

TEST_CASE("lineage C ABI: version and scratch sizes") {
  CHECK(attn_lineage_abi_version() == 5);
  char err[256];
  size_t small = 0, big = 0;
  REQUIRE(attn_lineage_fa3_backward_workspace(1, 1, 100, 64, &small, err, sizeof err) == ATTN_LINEAGE_OK);
  REQUIRE(attn_lineage_fa3_backward_workspace(2, 8, 1000, 128, &big, err, sizeof err) == ATTN_LINEAGE_OK);
  CHECK(small > 0);
  CHECK(big > small);
  CHECK(small % 256 == 0);
  // d = 128: 13 blocks of 80 rows for 1000 queries; two floats a row, d floats of dQ a row.
  const size_t rows = size_t(2) * 8 * 13 * 80;
  CHECK(big >= rows * 8 + rows * 128 * 4);
  CHECK(attn_lineage_fa3_backward_workspace(1, 1, 100, 256, &small, err, sizeof err) == ATTN_LINEAGE_BAD_ARGUMENT);
  CHECK(std::string(err).find("head dim 256") != std::string::npos);
  CHECK(attn_lineage_fa3_backward_workspace(0, 1, 100, 64, &small, err, sizeof err) == ATTN_LINEAGE_BAD_ARGUMENT);
  CHECK(attn_lineage_fa3_backward_workspace(1, 1, 100, 64, nullptr, err, sizeof err) == ATTN_LINEAGE_BAD_ARGUMENT);
}

TEST_CASE("lineage C ABI: refused calls return a code and a message") {
  char err[256];
  std::memset(err, 'x', sizeof err);
  if (have_device()) {
    MESSAGE("a CUDA device is present: the refusals without one are not exercised here");
    // Bad sizes are refused before any launch, on any GPU.
    const int code = attn_lineage_fa3_forward(0, nullptr, ATTN_LINEAGE_BF16, nullptr, nullptr, nullptr, nullptr,
                                              nullptr, 1, 3, 2, 128, 128, 64, 0.f, 0, err, sizeof err);
    CHECK(code != ATTN_LINEAGE_OK);
    CHECK(std::strlen(err) > 0);
    return;
  }
  CHECK(attn_lineage_device_ready(0, err, sizeof err) != ATTN_LINEAGE_OK);
  CHECK(std::strlen(err) > 0);
  CHECK(std::strlen(err) < sizeof err);
  CHECK(attn_lineage_fa3_forward(0, nullptr, ATTN_LINEAGE_BF16, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 1,
                                 128, 128, 64, 0.f, 0, err, sizeof err) != ATTN_LINEAGE_OK);
  CHECK(attn_lineage_fa3_backward(0, nullptr, ATTN_LINEAGE_BF16, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                  nullptr, nullptr, nullptr, nullptr, 0, 1, 1, 1, 128, 128, 64, 0.f, 0, 0, err,
                                  sizeof err) != ATTN_LINEAGE_OK);
  size_t bytes = 0;
  CHECK(attn_lineage_paged_decode_workspace(0, 1, 8, 2, 128, 4, 16, &bytes, err, sizeof err) != ATTN_LINEAGE_OK);
  // A one-byte buffer gets an empty string, a null buffer nothing: never an overrun.
  char tiny[1] = {'x'};
  CHECK(attn_lineage_device_ready(0, tiny, 1) != ATTN_LINEAGE_OK);
  CHECK(tiny[0] == '\0');
  CHECK(attn_lineage_device_ready(0, nullptr, 0) != ATTN_LINEAGE_OK);
}

TEST_CASE("lineage C ABI: the 8-bit paged decode refuses bad arguments before the device") {
  char err[256];
  const void* p = reinterpret_cast<const void*>(uintptr_t(0x10000));
  const float* sc = reinterpret_cast<const float*>(uintptr_t(0x40000));
  const int* table = reinterpret_cast<const int*>(uintptr_t(0x50000));
  void* o = reinterpret_cast<void*>(uintptr_t(0x20000));
  float* lse = reinterpret_cast<float*>(uintptr_t(0x30000));
  void* ws = reinterpret_cast<void*>(uintptr_t(0x60000));
  // kv_format, heads, kv_heads, d, page_size, k_scale: each case changes one, the rest valid
  auto call = [&](int fmt, int heads, int kv_heads, int d, int page_size, const float* k_scale) {
    std::memset(err, 'x', sizeof err);
    return attn_lineage_paged_decode_8bit(0, nullptr, fmt, p, p, p, k_scale, sc, table, table, o, lse, ws, 1 << 20, 2,
                                          heads, kv_heads, d, 40, 8, page_size, 0.f, err, sizeof err);
  };
  auto refused = [&](int code, const char* why) {
    INFO("code " << code << ": " << err);
    return code == ATTN_LINEAGE_BAD_ARGUMENT && std::string(err).find(why) != std::string::npos;
  };
  CHECK(refused(call(ATTN_LINEAGE_BF16, 8, 2, 128, 16, sc), "kv_format"));
  CHECK(refused(call(ATTN_LINEAGE_KV_INT8, 8, 3, 128, 16, sc), "multiple of kv_heads"));
  CHECK(refused(call(ATTN_LINEAGE_KV_FP8_E4M3, 8, 2, 64, 16, sc), "head dim 64"));
  CHECK(refused(call(ATTN_LINEAGE_KV_FP8_E4M3, 8, 2, 128, 12, sc), "power of two"));
  CHECK(refused(call(ATTN_LINEAGE_KV_INT8, 8, 2, 128, 4, sc), "at least 8 tokens"));
  CHECK(refused(call(ATTN_LINEAGE_KV_INT8, 8, 2, 128, 16, nullptr), "k_scale and v_scale"));
  size_t bytes = 0;
  CHECK(refused(attn_lineage_paged_decode_8bit_workspace(0, ATTN_LINEAGE_KV_FP8_E4M3, 2, 8, 2, 128, 8, 4, &bytes, err,
                                                         sizeof err),
                "at least 8 tokens"));
  CHECK(refused(attn_lineage_paged_decode_8bit_workspace(0, 9, 2, 8, 2, 128, 8, 16, &bytes, err, sizeof err),
                "kv_format"));
  // Valid arguments get as far as the device: refused without a GPU, a size with one.
  const int code = attn_lineage_paged_decode_8bit_workspace(0, ATTN_LINEAGE_KV_INT8, 2, 8, 2, 128, 8, 16, &bytes, err,
                                                            sizeof err);
  if (have_device()) {
    CHECK(code == ATTN_LINEAGE_OK);
    CHECK(bytes > 0);
    CHECK(bytes % 256 == 0);
  } else {
    CHECK(code != ATTN_LINEAGE_OK);
    CHECK(code != ATTN_LINEAGE_BAD_ARGUMENT);
    CHECK(std::strlen(err) > 0);
  }
}

namespace {

/// attn_lineage_masked_forward with everything valid but what a case changes (fake, aligned
/// pointers: only calls refused before the device use them).
struct Masked {
  int dtype = ATTN_LINEAGE_BF16, batch = 1, heads = 4, kv_heads = 2, nq = 100, nk = 100, d = 64;
  float scale = 0.f, softcap = 0.f;
  int causal = 0, left = -1, right = -1, docs = 0;
  const float* sinks = nullptr;
  const int* cu = nullptr;
  const void* q = reinterpret_cast<const void*>(uintptr_t(0x10000));
  char err[256];
  int run() {
    std::memset(err, 'x', sizeof err);
    void* o = reinterpret_cast<void*>(uintptr_t(0x20000));
    float* lse = reinterpret_cast<float*>(uintptr_t(0x30000));
    return attn_lineage_masked_forward(0, nullptr, dtype, q, q, q, o, lse, batch, heads, kv_heads, nq, nk, d, scale,
                                       causal, left, right, softcap, sinks, cu, docs, err, sizeof err);
  }
  bool refused(const char* why) {
    const int code = run();
    const std::string msg(err);
    INFO("code " << code << ": " << msg);
    return code == ATTN_LINEAGE_BAD_ARGUMENT && msg.find(why) != std::string::npos;
  }
};

}  // namespace

TEST_CASE("lineage C ABI: the masked forward refuses bad arguments before the device") {
  const float sink_logits[4] = {0, 0, 0, 0};
  const int cu_ok[4] = {0, 1, 40, 100};
  const int cu_empty[4] = {0, 40, 40, 100};
  const int cu_short[4] = {0, 1, 40, 99};
  const int cu_bad_start[4] = {3, 4, 40, 100};
  {
    Masked m;
    m.d = 96;
    CHECK(m.refused("head dim 96"));
  }
  {
    Masked m;
    m.dtype = 7;
    CHECK(m.refused("dtype"));
  }
  {
    Masked m;
    m.heads = 3;
    CHECK(m.refused("multiple of kv_heads"));
  }
  {
    Masked m;
    m.left = -2;
    CHECK(m.refused("window_left"));
  }
  {
    Masked m;
    m.right = -5;
    CHECK(m.refused("window_right"));
  }
  {
    Masked m;
    m.softcap = -1.f;
    CHECK(m.refused("softcap"));
  }
  {
    Masked m;
    m.softcap = 30.f;
    m.sinks = sink_logits;
    CHECK(m.refused("softcap and sinks together"));
  }
  {
    Masked m;  // softcap takes a causal sliding window, not a two-sided one
    m.softcap = 30.f;
    m.left = 16, m.right = 4;
    CHECK(m.refused("causal sliding window"));
  }
  {
    Masked m;
    m.sinks = sink_logits;
    m.right = 4;
    CHECK(m.refused("causal sliding window"));
  }
  {
    Masked m;
    m.docs = 3;  // documents without cu_seqlens
    CHECK(m.refused("docs must be 0"));
  }
  {
    Masked m;
    m.cu = cu_ok, m.docs = 3, m.batch = 2;
    CHECK(m.refused("batch must be 1"));
  }
  {
    Masked m;
    m.cu = cu_ok, m.docs = 3, m.nk = 90;
    CHECK(m.refused("nq = nk"));
  }
  {
    Masked m;
    m.cu = cu_ok, m.docs = 3, m.left = 8, m.right = 0;
    CHECK(m.refused("no window"));
  }
  {
    Masked m;
    m.cu = cu_ok, m.docs = 3, m.softcap = 2.f;
    CHECK(m.refused("no softcap"));
  }
  {
    Masked m;
    m.cu = cu_empty, m.docs = 3;
    CHECK(m.refused("document 1 is empty"));
  }
  {
    Masked m;
    m.cu = cu_short, m.docs = 3;
    CHECK(m.refused("cu_seqlens[docs] = 99"));
  }
  {
    Masked m;
    m.cu = cu_bad_start, m.docs = 3;
    CHECK(m.refused("cu_seqlens[0]"));
  }
  {
    Masked m;
    m.cu = cu_ok, m.docs = 0;
    CHECK(m.refused("docs must be >= 1"));
  }
  {
    Masked m;
    m.q = nullptr;
    CHECK(m.refused("q is null"));
  }
  {
    Masked m;
    m.q = reinterpret_cast<const void*>(uintptr_t(0x10008));
    CHECK(m.refused("16-byte aligned"));
  }
  if (!have_device()) {  // a valid call reaches the device check, and is refused there
    Masked m;
    m.cu = cu_ok, m.docs = 3, m.causal = 1;
    const int code = m.run();
    CHECK(code != ATTN_LINEAGE_OK);
    CHECK(code != ATTN_LINEAGE_BAD_ARGUMENT);
    CHECK(std::strlen(m.err) > 0);
    Masked w;
    w.left = 16, w.right = 0, w.softcap = 30.f, w.nq = 50;
    CHECK(w.run() != ATTN_LINEAGE_OK);
    CHECK(std::strlen(w.err) > 0);
  }
}


namespace {

/// attn_lineage_masked_backward with everything valid but what a case changes (fake, aligned
/// pointers, the workspace its size: only calls refused before the device use them).
struct MaskedBwd {
  int dtype = ATTN_LINEAGE_BF16, batch = 1, heads = 4, kv_heads = 2, nq = 100, nk = 100, d = 64;
  float scale = 0.f, softcap = 0.f;
  int causal = 0, left = 16, right = 0, deterministic = 0;
  const float* sinks = nullptr;
  float* dsink = nullptr;
  const void* q = reinterpret_cast<const void*>(uintptr_t(0x10000));
  size_t ws_bytes = 0;  // 0: the size attn_lineage_fa3_backward_workspace() gives
  char err[256];
  int run() {
    std::memset(err, 'x', sizeof err);
    void* out = reinterpret_cast<void*>(uintptr_t(0x20000));
    const float* lse = reinterpret_cast<const float*>(uintptr_t(0x30000));
    void* ws = reinterpret_cast<void*>(uintptr_t(0x40000));
    size_t need = 0;
    char e2[256];
    if (attn_lineage_fa3_backward_workspace(batch, heads, nq, d == 64 || d == 128 ? d : 64, &need, e2, sizeof e2) !=
        ATTN_LINEAGE_OK)
      return -1;
    return attn_lineage_masked_backward(0, nullptr, dtype, q, q, q, q, q, lse, out, out, out, dsink, ws,
                                        ws_bytes ? ws_bytes : need, batch, heads, kv_heads, nq, nk, d, scale, causal,
                                        left, right, softcap, sinks, deterministic, err, sizeof err);
  }
  bool refused(const char* why) {
    const int code = run();
    const std::string msg(err);
    INFO("code " << code << ": " << msg);
    return code == ATTN_LINEAGE_BAD_ARGUMENT && msg.find(why) != std::string::npos;
  }
};

}  // namespace

TEST_CASE("lineage C ABI: the masked backward refuses bad arguments before the device") {
  const float sink_logits[4] = {0, 0, 0, 0};
  float dsink[4];
  {
    MaskedBwd m;
    m.d = 256;  // the masked forward has d = 256, the backward does not
    CHECK(m.refused("the masked backward has kernels for 64, 128"));
  }
  {
    MaskedBwd m;
    m.heads = 3;
    CHECK(m.refused("multiple of kv_heads"));
  }
  {
    MaskedBwd m;
    m.softcap = 30.f, m.sinks = sink_logits;
    CHECK(m.refused("softcap and sinks together"));
  }
  {
    MaskedBwd m;
    m.softcap = 30.f, m.right = 4;
    CHECK(m.refused("causal sliding window"));
  }
  {
    MaskedBwd m;
    m.dsink = dsink;  // a sink's gradient with no sink
    CHECK(m.refused("dsink without sinks"));
  }
  {
    MaskedBwd m;
    m.ws_bytes = 256;
    CHECK(m.refused("workspace"));
  }
  {
    MaskedBwd m;
    m.q = nullptr;
    CHECK(m.refused("q is null"));
  }
  if (!have_device()) {  // a valid call reaches the device check, and is refused there
    MaskedBwd m;
    m.sinks = sink_logits, m.dsink = dsink, m.deterministic = 1;
    const int code = m.run();
    CHECK(code != ATTN_LINEAGE_OK);
    CHECK(code != ATTN_LINEAGE_BAD_ARGUMENT);
    CHECK(std::strlen(m.err) > 0);
  }
}

TEST_CASE("lineage C ABI: the MLA decode refuses bad arguments before the device") {
  char err[256];
  const void* p = reinterpret_cast<const void*>(uintptr_t(0x10000));
  void* w = reinterpret_cast<void*>(uintptr_t(0x20000));
  auto call = [&](const void* q, void* ws, int nq, int nk, float scale) {
    std::memset(err, 'x', sizeof err);
    return attn_lineage_mla_decode(0, nullptr, q, p, w, ws, 1 << 20, 2, 16, nq, nk, scale, err, sizeof err);
  };
  auto refused = [&](int code, const char* why) {
    INFO("code " << code << ": " << err);
    return code == ATTN_LINEAGE_BAD_ARGUMENT && std::string(err).find(why) != std::string::npos;
  };
  CHECK(refused(call(p, w, 5, 4, 0.f), "nq (5) must be <= nk (4)"));
  CHECK(refused(call(p, w, 0, 4, 0.f), "sizes must be positive"));
  CHECK(refused(call(nullptr, w, 1, 4, 0.f), "q is null"));
  CHECK(refused(call(p, reinterpret_cast<void*>(uintptr_t(0x20010)), 1, 4, 0.f), "workspace must be 256-byte aligned"));
  CHECK(refused(call(p, w, 1, 4, -1.f), "scale"));
  if (!have_device()) {
    size_t bytes = 0;
    CHECK(attn_lineage_mla_decode_workspace(0, 1, 16, 1, 100, &bytes, err, sizeof err) != ATTN_LINEAGE_OK);
    CHECK(std::strlen(err) > 0);
    const int code = call(p, w, 1, 4, 0.f);  // valid: refused at the device check
    CHECK(code != ATTN_LINEAGE_OK);
    CHECK(code != ATTN_LINEAGE_BAD_ARGUMENT);
  }
}
