// Kill points: named places where a crash test can have the process killed.
//
// TEST_KILL_POINT("publish.commit.before_write") compiles to nothing unless
// PRIMECACHE_KILL_POINTS is defined, which only the test variant of the
// library (primecache_statestore_killpoints, linked by the crash tests' child
// process) is built with. There, unarmed, it costs one relaxed atomic load;
// a child process is armed through its environment:
//   PRIMECACHE_KILL_POINT=name[@n]   raise SIGKILL at the n-th hit (default 1)
//                                    of the point called `name` ("*" = any point)
//   PRIMECACHE_KILL_TRACE=1          write "killpoint <name>" to stderr at every hit
// Both are read once, on the first hit.
#pragma once

#ifdef PRIMECACHE_KILL_POINTS

namespace primecache::killpoint {

void Hit(const char* name);

}  // namespace primecache::killpoint

#define TEST_KILL_POINT(name) ::primecache::killpoint::Hit(name)

#else

#define TEST_KILL_POINT(name) static_cast<void>(name)

#endif
