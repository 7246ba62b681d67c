// A fixed set of threads, each bound to one CPU, that run one function over a range split
// into equal contiguous parts (the optimizer's step is memory-bound: equal parts finish
// together).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hpcmem::optim {

class Pool {
 public:
  /// One thread per entry of `cpus` (a CPU number, or -1: not bound).
  explicit Pool(const std::vector<int>& cpus);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  /// Run `part(begin, end)` over [0, count) in parts that start at multiples of `align`, one
  /// per thread; returns when every part is done (rethrowing the first error).
  void run(std::size_t count, std::size_t align,
           const std::function<void(std::size_t, std::size_t)>& part);

  std::size_t size() const { return threads_.size(); }

 private:
  void serve(std::size_t index, int cpu);

  std::vector<std::thread> threads_;
  std::mutex run_mutex_;  // one run at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(std::size_t, std::size_t)>* part_ = nullptr;
  std::size_t count_ = 0;
  std::size_t align_ = 1;
  std::size_t generation_ = 0;
  std::size_t pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace hpcmem::optim
