// Chapter 06, the sm90a masked backward's fp16 kernels: hopper_backward.cu, included by path
// with CH06_BWD_FP16 set, so that this translation unit instantiates the kernel for __half
// (every policy at d = 64 and 128) and defines hopper_bwd::prepare_fp16(), which prepare()
// calls for an fp16 problem. The two compile side by side.
#define CH06_BWD_FP16 1
#include "masks/hopper_backward.cu"  // chapter 06's own sm90a masked backward (masks/hopper_backward.cu)
