// Clang's thread-safety annotations (-Wthread-safety), as LevelDB's
// port/thread_annotations.h: they say which mutex guards a field, which a
// function expects held or takes, and in which order mutexes are taken, and
// clang checks every access against them. Under other compilers (g++, the
// default build) they expand to nothing. The check runs in tools/lint
// (.clang-tidy passes -Wthread-safety); docs/DEVELOPING.md, "Checked
// locking", says how to use them.
#pragma once

#if defined(__clang__) && defined(__has_attribute)
#define PRIMECACHE_TSA(x) __attribute__((x))
#else
#define PRIMECACHE_TSA(x)
#endif

// A type that is a lock (core/mutex.h's Mutex and SharedMutex).
#ifndef CAPABILITY
#define CAPABILITY(x) PRIMECACHE_TSA(capability(x))
#endif
// An RAII type that holds a lock for its lifetime (MutexLock).
#ifndef SCOPED_CAPABILITY
#define SCOPED_CAPABILITY PRIMECACHE_TSA(scoped_lockable)
#endif
// A field read or written only with the mutex held (shared for reads, when
// the mutex is a SharedMutex).
#ifndef GUARDED_BY
#define GUARDED_BY(x) PRIMECACHE_TSA(guarded_by(x))
#endif
// A pointer whose pointee is guarded (the pointer itself is not).
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) PRIMECACHE_TSA(pt_guarded_by(x))
#endif
// Lock order: this mutex is taken only after (before) the ones named.
// Checked with -Wthread-safety-beta, which the lint enables.
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) PRIMECACHE_TSA(acquired_after(__VA_ARGS__))
#endif
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) PRIMECACHE_TSA(acquired_before(__VA_ARGS__))
#endif
// The caller holds the mutexes (exclusively; shared) on entry and exit.
#ifndef REQUIRES
#define REQUIRES(...) PRIMECACHE_TSA(requires_capability(__VA_ARGS__))
#endif
#ifndef REQUIRES_SHARED
#define REQUIRES_SHARED(...) PRIMECACHE_TSA(requires_shared_capability(__VA_ARGS__))
#endif
// The function takes (gives back) the mutexes and returns holding them (not).
#ifndef ACQUIRE
#define ACQUIRE(...) PRIMECACHE_TSA(acquire_capability(__VA_ARGS__))
#endif
#ifndef ACQUIRE_SHARED
#define ACQUIRE_SHARED(...) PRIMECACHE_TSA(acquire_shared_capability(__VA_ARGS__))
#endif
#ifndef RELEASE
#define RELEASE(...) PRIMECACHE_TSA(release_capability(__VA_ARGS__))
#endif
#ifndef RELEASE_SHARED
#define RELEASE_SHARED(...) PRIMECACHE_TSA(release_shared_capability(__VA_ARGS__))
#endif
#ifndef RELEASE_GENERIC
#define RELEASE_GENERIC(...) PRIMECACHE_TSA(release_generic_capability(__VA_ARGS__))
#endif
// Takes the mutex when it returns the first argument.
#ifndef TRY_ACQUIRE
#define TRY_ACQUIRE(...) PRIMECACHE_TSA(try_acquire_capability(__VA_ARGS__))
#endif
#ifndef TRY_ACQUIRE_SHARED
#define TRY_ACQUIRE_SHARED(...) PRIMECACHE_TSA(try_acquire_shared_capability(__VA_ARGS__))
#endif
// The caller must not hold the mutexes (the function takes them).
#ifndef EXCLUDES
#define EXCLUDES(...) PRIMECACHE_TSA(locks_excluded(__VA_ARGS__))
#endif
// Checks at run time (or promises) that the mutex is held.
#ifndef ASSERT_CAPABILITY
#define ASSERT_CAPABILITY(x) PRIMECACHE_TSA(assert_capability(x))
#endif
#ifndef ASSERT_SHARED_CAPABILITY
#define ASSERT_SHARED_CAPABILITY(x) PRIMECACHE_TSA(assert_shared_capability(x))
#endif
// The function returns a reference to the mutex.
#ifndef RETURN_CAPABILITY
#define RETURN_CAPABILITY(x) PRIMECACHE_TSA(lock_returned(x))
#endif
// The function is not checked (say why where it is used).
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS PRIMECACHE_TSA(no_thread_safety_analysis)
#endif
