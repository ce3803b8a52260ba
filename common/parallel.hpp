#pragma once
/// \file parallel.hpp
/// \brief parallel_for over independent work items (the reference's heads and row blocks).

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace attn {

/// Threads the host code may use: $ATTN_THREADS, else the hardware's count.
inline int host_threads() {
  if (const char* s = std::getenv("ATTN_THREADS")) {
    const int n = std::atoi(s);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

/// Calls fn(i) for i in [0, n), spread over host_threads() threads. Items must be
/// independent. The first exception thrown by any item is rethrown here.
template <class F>
void parallel_for(long n, F&& fn) {
  const int threads = int(std::min<long>(host_threads(), n));
  if (threads <= 1) {
    for (long i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<long> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (long i = next++; i < n; i = next++) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
      }
    });
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace attn
