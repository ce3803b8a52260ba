#pragma once
/// \file device_problem.cuh
/// \brief One forward problem resident on the device: Q, K and V uploaded once, O and
///        LSE allocated once, for every kernel a report runs on it.
///
/// A chapter binary times several kernels (its steps) on one problem. At the papers'
/// shapes every tensor is 16K tokens x 2048 wide, so uploading Q, K and V again for each
/// row would move 200 MB through the host a row for nothing. A runner keeps one
/// DeviceProblem and poisons the outputs before each run, so that no run can pass on
/// another's results (an unwritten element stays NaN):
///
///     DeviceProblem dev(p, inputs);      // Q, K, V in p.dtype; O (p.dtype) and LSE (fp32)
///     for (step : steps) {
///       dev.poison_outputs();
///       launch(step, dev.q, dev.k, dev.v, dev.o, dev.lse);
///       check(dev.o.to_host(), dev.lse.download());
///     }
///
/// Used by chapter 04's and chapter 05's ForwardRunner, chapter 03's forward, chapter 06's masked
/// forward and the ring's one-device baseline.

#include "common/cuda/buffer.cuh"
#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn {

struct DeviceProblem {
  Problem p;
  DeviceTensor q, k, v;  ///< the inputs, converted to p.dtype (round to nearest even)
  DeviceTensor o;        ///< [B][Hq][Nq][dv] in p.dtype
  DeviceBuffer<float> lse;  ///< [B][Hq][Nq], natural log

  DeviceProblem(const Problem& pr, const AttnInputs& in)
      : p(pr),
        q(DeviceTensor::from_host(in.q, pr.dtype)),
        k(DeviceTensor::from_host(in.k, pr.dtype)),
        v(DeviceTensor::from_host(in.v, pr.dtype)),
        o(pr.dtype, pr.o_elems()),
        lse(pr.lse_elems()) {}

  /// NaN in every element of O and LSE: call before every run that is checked.
  void poison_outputs() {
    o.poison();
    lse.poison();
  }
};

}  // namespace attn
