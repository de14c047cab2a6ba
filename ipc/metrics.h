// The daemon's metrics in the Prometheus text format (docs/metrics.md): the
// store's own figures (StoreStats, the numbers `primecachectl stats` shows),
// the counters the server's sessions keep (ServerCounters), and the remote
// tier's when there is one. Nothing is counted here: every number is read
// from where the daemon already keeps it.
#pragma once

#include <string>

#include "ipc/backend.h"
#include "ipc/session.h"
#include "primecache/status.h"

namespace primecache::ipc {

// One scrape's text. Reads only atomics and StoreBackend methods (which any
// non-loop thread may call), so it runs on the HTTP server's thread while
// the loop and the workers serve. An error when the store's Stat fails.
Result<std::string> RenderMetrics(StoreBackend& store, const ServerCounters& counters);

}  // namespace primecache::ipc
