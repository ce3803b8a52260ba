# cmake -DPTX_DIR=<dir> -P check_ptx.cmake: fails unless each step's PTX uses the
# instructions its step is about.
function(require file what)
  if(NOT EXISTS ${PTX_DIR}/${file})
    message(FATAL_ERROR "${PTX_DIR}/${file} is missing: build the ch05_ptx target")
  endif()
  file(READ ${PTX_DIR}/${file} text)
  foreach(needle IN LISTS what)
    string(FIND "${text}" "${needle}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${file} does not contain '${needle}'")
    endif()
  endforeach()
  message(STATUS "${file}: ${what}")
endfunction()

# more(file parent what): `what` occurs more often in file's PTX than in its parent's.
function(more file parent what)
  foreach(f IN ITEMS ${file} ${parent})
    file(READ ${PTX_DIR}/${f} text)
    string(REGEX MATCHALL "${what}" hits "${text}")
    list(LENGTH hits n_${f})
  endforeach()
  if(NOT n_${file} GREATER n_${parent})
    message(FATAL_ERROR "${file} has ${n_${file}} '${what}', not more than ${parent}'s ${n_${parent}}")
  endif()
  message(STATUS "${file}: ${n_${file}} '${what}' against ${parent}'s ${n_${parent}}")
endfunction()

function(forbid file what)
  file(READ ${PTX_DIR}/${file} text)
  string(FIND "${text}" "${what}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "${file} unexpectedly contains '${what}'")
  endif()
endfunction()

# v1: TMA and mbarriers, but still mma.sync.
require(v1_tma.ptx "cp.async.bulk.tensor.3d;mbarrier.try_wait.parity;mbarrier.arrive.expect_tx;mma.sync.aligned.m16n8k16")
forbid(v1_tma.ptx "wgmma.mma_async")
# v3: warp specialisation re-divides registers.
require(v3_warp_specialized.ptx "wgmma.mma_async.sync.aligned.m64n128k16;cp.async.bulk.tensor.3d;mbarrier.try_wait.parity;setmaxnreg.inc.sync.aligned.u32 240;setmaxnreg.dec.sync.aligned.u32 24")
# v5: pingpong named barriers and the wgmma group waits of the overlap.
require(v5_intra_overlap.ptx "wgmma.mma_async;wgmma.wait_group.sync.aligned 1;bar.sync;bar.arrive;setmaxnreg")
# v7: persistent blocks read the grid size to walk their tiles.
require(v7_persistent.ptx "%nctaid.x;wgmma.mma_async.sync.aligned.m64n128k16;mbarrier.try_wait.parity;bar.sync")
# v8: every head dim (d = 256 takes m64n256 for P V, d = 64 m64n64; Bc = 64 at d = 256 takes m64n64 for Q K^T).
require(v8_head_dims.ptx "wgmma.mma_async.sync.aligned.m64n256k16;wgmma.mma_async.sync.aligned.m64n64k16;cp.async.bulk.tensor;mbarrier;setmaxnreg")
# The backward. b1: all five products on wgmma (S^T and dP^T SS m64n64; dV, dK RS m64n128 at
# d = 128; dQ with both operands transposed, m64n64 at d = 128 and m64n32 at d = 64), the
# 1-D bulk copies of LSE and D, dQ's bulk reduce-add and its waits, the proxy fence, and the
# deterministic mode's acquire/release counter.
require(b1_wgmma_backward.ptx "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16;wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16;wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16;cp.async.bulk.tensor.3d;cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;cp.async.bulk.commit_group;cp.async.bulk.wait_group.read 0;cp.async.bulk.wait_group 0;fence.proxy.async.shared::cta;ld.acquire.gpu")
forbid(b1_wgmma_backward.ptx "setmaxnreg")
forbid(b1_wgmma_backward.ptx "red.global.add.f32")
forbid(b1_wgmma_backward.ptx "atom.global.add.f32")
# b2: the same products and copies, warp-specialised (setmaxnreg, the ring's mbarriers, named barriers).
require(b2_warp_specialized.ptx "wgmma.mma_async.sync.aligned.m64n64k16;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;setmaxnreg.inc.sync.aligned.u32 240;setmaxnreg.dec.sync.aligned.u32 24;mbarrier.try_wait.parity;mbarrier.arrive.expect_tx;bar.sync")
# b5: the dQ writer warp waits on mbarriers the consumers arrive on (the same instructions).
require(b5_dq_writer.ptx "wgmma.mma_async.sync.aligned.m64n64k16;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;cp.async.bulk.wait_group.read 0;mbarrier.try_wait.parity;setmaxnreg.dec.sync.aligned.u32 24")
# b6: b5 with the deterministic walk reversed (the same instructions).
require(b6_deterministic_walk.ptx "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;ld.acquire.gpu;mbarrier.try_wait.parity")
# b10: b9 with consumer 0's dQ a step late (the meeting as one-way bar.arrive / bar.sync signals).
require(b10_consumer_offset.ptx "bar.arrive;bar.sync;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32")
# b11: b10's kernel (only the causal grid's order differs).
require(b11_longest_walks_first.ptx "bar.arrive;bar.sync;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32")

# The final kernels. final: v23's key blocks at d = 128 and 256 (m64n176, m64n80), v28's three
# consumers at d = 64 (setmaxnreg 160, tiles from a global counter), exponentials on MUFU.
require(final.ptx "wgmma.mma_async.sync.aligned.m64n176k16;wgmma.mma_async.sync.aligned.m64n80k16;setmaxnreg.inc.sync.aligned.u32 160;atom.global.add;ex2.approx;cp.async.bulk.tensor;mbarrier.try_wait.parity")
# final_fp8: e4m3 tensor cores; key blocks of 192 at d = 128 (an n128 and an n64 wgmma), P V as
# m64n256k32 at d = 256; the warp's vote for the lazy rescale.
require(final_fp8.ptx "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3;wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3;wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3;vote.sync.any.pred;ex2.approx")
# final_backward: b12's 128 queries a step at d = 64 (m64n128 S^T, m64n64 dQ), b13's 80 at d = 128 (m64n80);
# b16's shared accesses (ld.shared, stmatrix) and b17's waits with one product in flight.
require(final_backward.ptx "ld.shared.v2.f32;st.shared.v2.f32;stmatrix.sync.aligned.m8n8.x4.shared.b16;wgmma.wait_group.sync.aligned 1;wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16;wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16;wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;bar.arrive;bar.sync;setmaxnreg")

# The lab's steps (steps/lab/), in a build configured with TUTORIAL_LAB=ON.
if(LAB)
  # v9: fp8 tensor cores.
  require(v9_fp8.ptx "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3;cp.async.bulk.tensor;mbarrier;setmaxnreg;cvt.rn.satfinite.e4m3x2.f32")
  # v10: FA3's key blocks, Q K^T as m64n176k16 (d = 128, not causal) and m64n80k16 (d = 256).
  require(v10_tile_sizes.ptx "wgmma.mma_async.sync.aligned.m64n176k16;wgmma.mma_async.sync.aligned.m64n80k16;wgmma.mma_async.sync.aligned.m64n256k16;wgmma.wait_group.sync.aligned 1;setmaxnreg")
  # v11: the same GEMMs as v10; the polynomial 2^x sits next to MUFU's ex2.approx.
  require(v11_two_pipe_exp.ptx "wgmma.mma_async.sync.aligned.m64n176k16;wgmma.mma_async.sync.aligned.m64n80k16;ex2.approx")
  # v12: fp8 tensor cores as in v9.
  require(v12_fp8_two_pipes.ptx "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3;cvt.rn.satfinite.e4m3x2.f32;ex2.approx")
  # v13: the producer takes tiles from a global counter (an atomic add), hands them over through mbarriers.
  require(v13_dynamic_tiles.ptx "atom.global.add;mbarrier.try_wait.parity;wgmma.mma_async.sync.aligned.m64n176k16")
  # b3: b2 with dQ's tile in fragment order (the same instructions).
  require(b3_dq_fragment_order.ptx "wgmma.mma_async.sync.aligned.m64n64k16;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;setmaxnreg.inc.sync.aligned.u32 240")
  # b4: b3 with its descriptors rebuilt every step (the same instructions).
  require(b4_no_spills.ptx "wgmma.mma_async.sync.aligned.m64n64k16;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;setmaxnreg.inc.sync.aligned.u32 240")
  # v14: three consumer warpgroups re-divide the registers as 24 / 160; the turn goes round three barriers.
  require(v14_three_consumers.ptx "setmaxnreg.inc.sync.aligned.u32 160;setmaxnreg.dec.sync.aligned.u32 24;bar.sync;bar.arrive;atom.global.add")
  # b7: dQ split by keys takes the m64n128 form with both operands transposed at d = 128.
  require(b7_dq_split_by_keys.ptx "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;bar.sync")
  # v15: the warp votes whether any row of it needs O rescaled.
  require(v15_fp8_lazy_rescale.ptx "vote.sync.any.pred;wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3;ex2.approx")
  # v16: v11's kernel (only the launch grid differs).
  require(v16_causal_grid.ptx "wgmma.mma_async.sync.aligned.m64n176k16;wgmma.mma_async.sync.aligned.m64n80k16;ex2.approx;setmaxnreg")
  # b8: the stages released on named barriers (bar.arrive by the consumers, bar.sync by the producer's warp).
  require(b8_named_barrier_release.ptx "bar.arrive;bar.sync;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;mbarrier.try_wait.parity")
  # b9: b8 with two dS^T buffers (the same instructions).
  require(b9_two_ds_buffers.ptx "bar.arrive;bar.sync;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32")
  # b12: 128 queries a step, d = 64 only (S^T and dP^T m64n128; dV, dK and a whole block's dQ m64n64),
  # so no m64n32 (b11's dQ half at d = 64).
  require(b12_pairs_of_query_blocks.ptx "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16;wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;bar.arrive;bar.sync;setmaxnreg")
  forbid(b12_pairs_of_query_blocks.ptx "wgmma.mma_async.sync.aligned.m64n32k16")
  # b13: 80 queries a step, d = 128 only (S^T, dP^T and the transposed dQ^T m64n80; dV, dK m64n128).
  require(b13_eighty_queries.ptx "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16;wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;bar.arrive;bar.sync;setmaxnreg")
  forbid(b13_eighty_queries.ptx "wgmma.mma_async.sync.aligned.m64n64k16")
  # b14: b13 with dS stored by queries (dQ^T with only A transposed: the immediates 1, 1, 1, 0).
  require(b14_ds_by_queries.ptx "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16;p, 1, 1, 1, 0;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;setmaxnreg")
  # b15: b13 with the next step's S^T issued before this step's dQ leaves (same products, m64n80 and m64n128).
  require(b15_scores_ahead.ptx "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16;wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;bar.arrive;bar.sync;setmaxnreg")
  # b16: the final backward with LSE_i and D_i read by ld.shared, dS^T stored by stmatrix, dQ by st.shared.
  require(b16_shared_state_space.ptx "ld.shared.v2.f32;st.shared.v2.f32;stmatrix.sync.aligned.m8n8.x4.shared.b16;wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16;wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16;setmaxnreg")
  # b17: b16 with three commit groups a step, each wait leaving one product in flight.
  require(b17_fa4_order.ptx "stmatrix.sync.aligned.m8n8.x4.shared.b16;wgmma.wait_group.sync.aligned 1;wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16;cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32;setmaxnreg")
  # v17: v11 at d = 64 only, the causal kernel with key blocks of 192 too.
  require(v17_causal_key_blocks.ptx "wgmma.mma_async.sync.aligned.m64n192k16;ex2.approx;setmaxnreg")
  forbid(v17_causal_key_blocks.ptx "wgmma.mma_async.sync.aligned.m64n128k16")
  # v18: v17 at every head dim, the causal kernels with key blocks of 176 and 80 too.
  require(v18_causal_blocks_registers.ptx "wgmma.mma_async.sync.aligned.m64n192k16;wgmma.mma_async.sync.aligned.m64n176k16;wgmma.mma_async.sync.aligned.m64n80k16;setmaxnreg")
  # v19: v18's kernel at d = 128 and 256 (only the launch grid differs).
  require(v19_causal_grid_wide_blocks.ptx "wgmma.mma_async.sync.aligned.m64n176k16;wgmma.mma_async.sync.aligned.m64n80k16;setmaxnreg")
  # v20: v17 with one exponential in eight on the FMA pipe (still ex2.approx for the others).
  require(v20_exp_one_in_eight.ptx "wgmma.mma_async.sync.aligned.m64n192k16;ex2.approx;setmaxnreg")
  # v21: v18 with the softmax's row reductions in four chains (its key blocks: 192, 176, 80).
  require(v21_softmax_chains.ptx "wgmma.mma_async.sync.aligned.m64n192k16;wgmma.mma_async.sync.aligned.m64n176k16;wgmma.mma_async.sync.aligned.m64n80k16;max.f32;ex2.approx;setmaxnreg")
  # v22: v14 with v21's row reductions in chains (three consumers: setmaxnreg to 160, Bc = 128).
  require(v22_three_consumers_chains.ptx "wgmma.mma_async.sync.aligned.m64n128k16;setmaxnreg.inc.sync.aligned.u32 160;ex2.approx")
  # v23: v21 with the descriptors moved by addition (the key blocks of v18 and v21: 192, 176, 80).
  require(v23_descriptors_by_addition.ptx "wgmma.mma_async.sync.aligned.m64n192k16;wgmma.mma_async.sync.aligned.m64n176k16;wgmma.mma_async.sync.aligned.m64n80k16;setmaxnreg")
  # v24: v23's kernel with the causal list in L2 sections (only the walk's order differs).
  require(v24_causal_l2_sections.ptx "wgmma.mma_async.sync.aligned.m64n192k16;wgmma.mma_async.sync.aligned.m64n176k16;wgmma.mma_async.sync.aligned.m64n80k16;setmaxnreg")
  # v25: v14 with v23's descriptors by addition (three consumers: setmaxnreg to 160, Bc = 128).
  require(v25_three_consumers_descriptors.ptx "wgmma.mma_async.sync.aligned.m64n128k16;setmaxnreg.inc.sync.aligned.u32 160;ex2.approx")
  # v26: v15 at d = 256 with key blocks of 128: Q K^T as m64n128k32 e4m3, P V as m64n256k32.
  require(v26_fp8_wide_blocks_d256.ptx "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3;wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3;vote.sync.any.pred;ex2.approx")
  forbid(v26_fp8_wide_blocks_d256.ptx "wgmma.mma_async.sync.aligned.m64n64k32")
  # v27: v15 at d = 128 with key blocks of 192: S as an n128 and an n64 wgmma.
  require(v27_fp8_wide_blocks_d128.ptx "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3;wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3;vote.sync.any.pred")
  # v28: v25 with every exponential on MUFU: more ex2.approx, fewer FMA-pipe instructions.
  require(v28_three_consumers_mufu_exp.ptx "wgmma.mma_async.sync.aligned.m64n128k16;setmaxnreg.inc.sync.aligned.u32 160;ex2.approx")
  more(v28_three_consumers_mufu_exp.ptx v25_three_consumers_descriptors.ptx "ex2\\.approx")
  more(v25_three_consumers_descriptors.ptx v28_three_consumers_mufu_exp.ptx "fma\\.rn\\.f32")
  # v29: v26 with every exponential on MUFU.
  require(v29_fp8_mufu_exp_d256.ptx "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3;wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3;ex2.approx")
  more(v29_fp8_mufu_exp_d256.ptx v26_fp8_wide_blocks_d256.ptx "ex2\\.approx")
  more(v26_fp8_wide_blocks_d256.ptx v29_fp8_mufu_exp_d256.ptx "fma\\.rn\\.f32")
endif()
