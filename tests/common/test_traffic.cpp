#include <doctest/doctest.h>

#include "common/errors.hpp"
#include "common/traffic.hpp"

using namespace attn;

TEST_CASE("global tensors count bytes of their stored type") {
  Traffic t;
  std::vector<float> host(100, 1.5f);
  GlobalTensor in(t, "in", host, DType::bf16);
  GlobalTensor out(t, "out", 100, DType::f32, Role::output);
  std::vector<float> buf(16);
  in.load(20, 10, buf.data());
  CHECK(t.bytes_read == 20);  // 10 bf16 elements
  out.store(0, 10, buf.data());
  CHECK(t.bytes_written == 40);
  in.load_block(0, 3, 4, 10, buf.data());  // 3 rows of 4
  CHECK(t.bytes_read == 20 + 24);
  CHECK(in.get(5) == 1.5f);
  CHECK(t.bytes_read == 20 + 24 + 2);
  CHECK_THROWS(in.load(95, 10, buf.data()));  // out of bounds is an error, not a silent read
}

TEST_CASE("stores round to the tensor's dtype") {
  Traffic t;
  GlobalTensor o(t, "o", 1, DType::bf16, Role::output);
  o.set(0, 1.0f + 0x1.0p-9f);
  CHECK(o.host()[0] == 1.0f);
}

TEST_CASE("scratch tensors are the extra memory, with their peak") {
  Traffic t;
  {
    GlobalTensor s(t, "S", 1000, DType::f32, Role::scratch);
    CHECK(t.extra_bytes == 4000);
    GlobalTensor o(t, "O", 1000, DType::f32, Role::output);
    CHECK(t.extra_bytes == 4000);  // outputs are not extra
  }
  CHECK(t.extra_bytes == 0);
  CHECK(t.extra_peak == 4000);
}

TEST_CASE("the on-chip budget is enforced, and tiles give their bytes back") {
  OnChip sram(1024);
  {
    Tile a = sram.tile("a", 128);  // 512 bytes
    Tile b = sram.tile("b", 256, 2);
    CHECK(sram.used() == 1024);
    CHECK_THROWS_AS(sram.tile("c", 1), SramOverflow);
  }
  CHECK(sram.used() == 0);
  CHECK(sram.peak() == 1024);
  Tile big;
  CHECK_THROWS_AS(big = sram.tile("too big", 257), SramOverflow);
}

TEST_CASE("byte formatting") {
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1.5e6) == "1.5 MB");
  CHECK(format_bytes(2.25e9) == "2.25 GB");
}
