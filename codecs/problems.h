// Collects every disagreement a check finds, so that one refusal names them
// all ("width 576 != plan 512; len 9000 > max_ctx 8192"). Internal to
// primecache_codecs; a single-thread value.
#pragma once

#include <string>
#include <string_view>

#include "primecache/status.h"

namespace primecache::codecs {

class Problems {
 public:
  void Add(const std::string& problem) {
    if (!text_.empty()) text_ += "; ";
    text_ += problem;
  }
  // Adds a failed status's message under a prefix ("layer 3: ...").
  // An empty prefix adds the message alone.
  void Add(std::string_view prefix, const Status& s) {
    if (s.ok()) return;
    Add(prefix.empty() ? s.message() : std::string(prefix) + ": " + s.message());
  }
  bool empty() const { return text_.empty(); }
  Status ToStatus(StatusCode code = StatusCode::kInvalidArgument) const {
    return empty() ? Status::Ok() : Status(code, text_);
  }

 private:
  std::string text_;
};

}  // namespace primecache::codecs
