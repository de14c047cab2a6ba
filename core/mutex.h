// Mutexes that clang's thread-safety analysis understands (core/
// thread_annotations.h), as LevelDB's port::Mutex: libstdc++'s std::mutex
// and std::shared_mutex carry no annotations, so a field GUARDED_BY one of
// them could not be checked. These wrap them and cost nothing more.
//
//   Mutex mu_;
//   int n_ GUARDED_BY(mu_);
//   void Add() EXCLUDES(mu_) { MutexLock l(&mu_); ++n_; }
//
// A condition variable waits with the Mutex held: `while (!ready_)
// cv_.Wait(&mu_);`, or `cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return
// ready_; })` (the predicate says it runs with the mutex held, and is checked
// as such).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "core/thread_annotations.h"

namespace primecache {

class CondVar;

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds it (where it cannot see that,
  // e.g. in a callback run under the lock); checks nothing at run time.
  void AssertHeld() ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Many readers (shared) or one writer (exclusive).
class CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void LockShared() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() RELEASE_SHARED() { mu_.unlock_shared(); }
  void AssertHeld() ASSERT_CAPABILITY(this) {}
  void AssertReaderHeld() ASSERT_SHARED_CAPABILITY(this) {}

 private:
  std::shared_mutex mu_;
};

// Holds a Mutex, or a SharedMutex exclusively, for its scope. Unlock() and
// Lock() let go of it and take it again within the scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu->Lock(); }
  explicit MutexLock(SharedMutex* mu) ACQUIRE(mu) : shared_(mu) { mu->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) Release();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    Release();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    if (mu_ != nullptr) mu_->Lock();
    if (shared_ != nullptr) shared_->Lock();
    held_ = true;
  }

 private:
  void Release() NO_THREAD_SAFETY_ANALYSIS {
    if (mu_ != nullptr) mu_->Unlock();
    if (shared_ != nullptr) shared_->Unlock();
  }
  Mutex* mu_ = nullptr;
  SharedMutex* shared_ = nullptr;
  bool held_ = true;
};

// Holds a SharedMutex shared for its scope.
class SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu->LockShared(); }
  ~ReaderLock() RELEASE() { mu_->UnlockShared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex* mu_;
};

// A condition variable for Mutex. Every wait is called with the mutex held,
// and returns with it held.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    cv_.wait(l);
    l.release();
  }
  // Waits until `ready()` holds; `ready` runs with the mutex held (annotate
  // the lambda REQUIRES(mu) so that its body is checked as such).
  template <class Pred>
  void Wait(Mutex* mu, Pred ready) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    cv_.wait(l, Unchecked(ready));
    l.release();
  }
  // As Wait, for at most `timeout`: false when it ran out with `ready()`
  // still false.
  template <class Rep, class Period, class Pred>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout, Pred ready) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    bool ok = cv_.wait_for(l, timeout, Unchecked(ready));
    l.release();
    return ok;
  }
  // A wait of at most `timeout` (or a spurious wakeup): false when it ran out.
  template <class Rep, class Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    bool ok = cv_.wait_for(l, timeout) == std::cv_status::no_timeout;
    l.release();
    return ok;
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  // The analysis cannot see that std::condition_variable calls the
  // predicate with the mutex held; the predicate's own REQUIRES is checked
  // where it is written.
  template <class Pred>
  static auto Unchecked(Pred& ready) {
    return [&ready]() NO_THREAD_SAFETY_ANALYSIS { return ready(); };
  }
  std::condition_variable cv_;
};

}  // namespace primecache
