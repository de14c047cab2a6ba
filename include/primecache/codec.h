// Transitional: this header is internal to the build and lives at
// primecache/internal/codec.h (include/primecache/ holds the installed headers,
// internal/ the rest: docs/DEVELOPING.md, "Public headers"). This forwarder
// serves only files of statestore/, ipc/, remote/ and tools/ctl/ (and their
// tests) that still include the old path while other changes edit them; new
// code includes the internal path, and the forwarder goes once none is left.
#pragma once

#include "primecache/internal/codec.h"
