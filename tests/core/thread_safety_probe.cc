// The thread-safety check's probe (thread_safety_check.sh): CASE 0 locks
// correctly and must pass; every other CASE plants one violation that the
// check must reject. Not part of any build: only the check compiles it.
#include "core/mutex.h"
#include "core/thread_annotations.h"

namespace primecache {

class Probe {
 public:
  void Add() EXCLUDES(mu_) {
#if CASE == 1  // an unguarded access to a GUARDED_BY field
    ++n_;
#else
    MutexLock l(&mu_);
    ++n_;
#endif
  }

  void Both() EXCLUDES(outer_, mu_) {
#if CASE == 2  // the documented order broken: mu_ is ACQUIRED_AFTER outer_
    MutexLock a(&mu_);
    MutexLock b(&outer_);
#else
    MutexLock a(&outer_);
    MutexLock b(&mu_);
#endif
    AddLocked();
  }

  void Call() EXCLUDES(mu_) {
#if CASE == 3  // a REQUIRES function called without its lock
    AddLocked();
#else
    MutexLock l(&mu_);
    AddLocked();
#endif
  }

  int Read() EXCLUDES(sm_) {
#if CASE == 4  // a write under a shared (reader) lock
    ReaderLock l(&sm_);
    s_ = 1;
#else
    MutexLock l(&sm_);
    s_ = 1;
#endif
    return s_ == 1 ? 0 : 1;  // still under l
  }

  void Wait() EXCLUDES(mu_) {
    MutexLock l(&mu_);
#if CASE == 5  // a condition predicate that does not say it runs under the lock
    cv_.Wait(&mu_, [&] { return n_ > 0; });
#else
    cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return n_ > 0; });
#endif
  }

 private:
  void AddLocked() REQUIRES(mu_) {
    ++n_;
  }

  Mutex outer_;
  Mutex mu_ ACQUIRED_AFTER(outer_);
  CondVar cv_;
  int n_ GUARDED_BY(mu_) = 0;
  SharedMutex sm_;
  int s_ GUARDED_BY(sm_) = 0;
};

}  // namespace primecache
