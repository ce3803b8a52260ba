#pragma once
/// \file setmaxnreg.cuh
/// \brief Re-dividing the register file between warpgroups at run time (sm_90a).
///
/// Wraps `setmaxnreg.dec` and `setmaxnreg.inc`, PTX ISA "Miscellaneous Instructions:
/// setmaxnreg". A warpgroup gives registers back (dec) or takes more (inc) while the
/// kernel runs, so a producer that needs ~24 registers does not cost the consumers
/// the ~200 they need:
///
///     producer (128 threads):       setmaxnreg_dec<24>()
///     two consumers (256 threads):  setmaxnreg_inc<240>()    128 x 24 + 256 x 240 = 64,512 <= 65,536
///
/// Executed by all 128 threads of a warpgroup. It needs a register count fixed at
/// entry, i.e. `__launch_bounds__(threads, 1)` on the kernel (else ptxas ignores it
/// with warning C7508). The counts are multiples of 8 in [24, 256]. CCCL's
/// `cuda::ptx` has no wrapper for it, so this is inline PTX.

namespace attn::hopper {

/// This warpgroup now needs at most kRegs registers per thread; the rest go back to the pool.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
/// This warpgroup waits until kRegs registers per thread are free in the pool, and takes them.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace attn::hopper
