#include "pool.hpp"

#include <algorithm>

#include <pthread.h>
#include <sched.h>

namespace hpcmem::optim {

Pool::Pool(const std::vector<int>& cpus) {
  threads_.reserve(cpus.size());
  for (std::size_t i = 0; i < cpus.size(); ++i) {
    threads_.emplace_back(&Pool::serve, this, i, cpus[i]);
  }
}

Pool::~Pool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& thread : threads_) thread.join();
}

void Pool::run(std::size_t count, std::size_t align,
               const std::function<void(std::size_t, std::size_t)>& part) {
  std::lock_guard<std::mutex> one(run_mutex_);
  std::unique_lock<std::mutex> lock(mutex_);
  part_ = &part;
  count_ = count;
  align_ = align ? align : 1;
  pending_ = threads_.size();
  error_ = nullptr;
  ++generation_;
  wake_.notify_all();
  done_.wait(lock, [this] { return pending_ == 0; });
  part_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void Pool::serve(std::size_t index, int cpu) {
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // best effort: the mask may
                                                                // have changed since
  }
  std::size_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const std::size_t n = threads_.size();
    const std::size_t units = (count_ + align_ - 1) / align_;
    const std::size_t begin = std::min(count_, units * index / n * align_);
    const std::size_t end = std::min(count_, units * (index + 1) / n * align_);
    const auto* part = part_;
    lock.unlock();
    std::exception_ptr error;
    if (begin < end) {
      try {
        (*part)(begin, end);
      } catch (...) {
        error = std::current_exception();
      }
    }
    lock.lock();
    if (error && !error_) error_ = error;
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace hpcmem::optim
