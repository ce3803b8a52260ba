// Chapter 06, the final masked forward's fp16 kernels: steps/final.cu, included by path with
// CH06_FINAL_FP16 set, so that this translation unit instantiates the kernel for __half (every
// policy at d = 64, 128 and 256) and defines hopper_final::prepare_fp16(), which prepare()
// calls for an fp16 problem. The bf16 kernels stay in steps/final.cu's own translation unit;
// the two compile in parallel, and neither holds the other's 30 instantiations.
#define CH06_FINAL_FP16 1
#include "masks/steps/final.cu"  // chapter 06's own final kernel (masks/steps/final.cu)
