// The daemon's metrics in the Prometheus text format (docs/metrics.md): the
// store's own figures (StoreStats, the numbers `primecachectl stats` shows),
// the counters the server's sessions keep (ServerCounters), and the remote
// tier's when there is one. Nothing is counted here: every number is read
// from where the daemon already keeps it.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "ipc/session.h"
#include "primecache/status.h"

namespace primecache::ipc {

// One scrape's text. Reads only atomics, the store's Stat and
// `remote_stats` (which any non-loop thread may call), so it runs on the
// HTTP server's thread while the loop and the workers serve. An error when
// the store's Stat fails. `remote_stats` unset: no remote tier.
Result<std::string> RenderMetrics(Store& store, const std::function<std::optional<RemoteStats>()>& remote_stats,
                                  const ServerCounters& counters);

}  // namespace primecache::ipc
