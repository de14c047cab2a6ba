// ClusterClient: the public surface. Routing, retries and batches are in
// cluster_impl.cc; connections and replies in redis_conn.cc.
#include "remote/cluster_client.h"

#include <charconv>

#include "remote/cluster_impl.h"

namespace primecache::remote {
namespace {

// SET answers the status "OK"; anything else is a failure to report.
Status ExpectOk(const Result<std::optional<std::string>>& r) {
  if (!r.ok()) return r.status();
  const std::optional<std::string>& v = *r;
  if (v.has_value() && v->compare("OK") == 0) return Status::Ok();
  return Status::IOError("redis SET answered " + (v.has_value() ? *v : std::string("nil")));
}

}  // namespace

Result<std::vector<Endpoint>> ParseRedisUrl(std::string_view url) {
  constexpr std::string_view kScheme = "redis://";
  if (url.substr(0, kScheme.size()) == kScheme) url.remove_prefix(kScheme.size());
  std::vector<Endpoint> out;
  while (!url.empty()) {
    const std::size_t comma = url.find(',');
    const std::string_view item = url.substr(0, comma);
    url = comma == std::string_view::npos ? std::string_view{} : url.substr(comma + 1);
    const std::size_t colon = item.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == item.size()) {
      return Status::InvalidArgument("redis address \"" + std::string(item) + "\" is not host:port");
    }
    int port = 0;
    const std::string_view digits = item.substr(colon + 1);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
    if (ec != std::errc() || end != digits.data() + digits.size() || port <= 0 || port > 65535) {
      return Status::InvalidArgument("redis address \"" + std::string(item) + "\" has no valid port");
    }
    out.push_back({std::string(item.substr(0, colon)), port});
  }
  if (out.empty()) return Status::InvalidArgument("no redis address given");
  return out;
}

ClusterClient::ClusterClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClusterClient::~ClusterClient() = default;

Result<std::unique_ptr<ClusterClient>> ClusterClient::Open(ClusterOptions options) {
  if (options.seeds.empty()) return Status::InvalidArgument("a cluster client needs at least one seed address");
  return std::unique_ptr<ClusterClient>(new ClusterClient(std::make_unique<Impl>(std::move(options))));
}

Result<std::unique_ptr<ClusterClient>> ClusterClient::Connect(ClusterOptions options) {
  PC_ASSIGN_OR_RETURN(auto client, Open(std::move(options)));
  PC_RETURN_IF_ERROR(client->Refresh());
  return client;
}

Result<std::optional<std::string>> ClusterClient::Get(std::string_view key) {
  return impl_->Text(key, {"GET", std::string(key)});
}

Status ClusterClient::Set(std::string_view key, std::string_view value) {
  return ExpectOk(impl_->Text(key, {"SET", std::string(key), std::string(value)}));
}

Result<bool> ClusterClient::Del(std::string_view key) {
  PC_ASSIGN_OR_RETURN(auto r, impl_->Text(key, {"DEL", std::string(key)}));
  return r.has_value() && r->compare("0") != 0;
}

Result<std::optional<std::string>> ClusterClient::Command(std::string_view key, std::vector<std::string> argv) {
  return impl_->Text(key, std::move(argv));
}

Result<std::vector<std::optional<std::string>>> ClusterClient::GetMany(std::span<const std::string> keys) {
  std::vector<BatchOp> ops(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) ops[i].argv = {"GET", keys[i]};
  PC_RETURN_IF_ERROR(impl_->RunBatch(ops));
  std::vector<std::optional<std::string>> out(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    PC_ASSIGN_OR_RETURN(out[i], ReplyText(ops[i].reply.get(), impl_->options().max_value_bytes));
  }
  return out;
}

Status ClusterClient::SetMany(std::span<const std::pair<std::string, std::string>> items) {
  std::vector<BatchOp> ops(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) ops[i].argv = {"SET", items[i].first, items[i].second};
  PC_RETURN_IF_ERROR(impl_->RunBatch(ops));
  for (const BatchOp& op : ops) PC_RETURN_IF_ERROR(ExpectOk(ReplyText(op.reply.get(), impl_->options().max_value_bytes)));
  return Status::Ok();
}

namespace {

// The final states of GetInto's ops.
Result<std::vector<ValueState>> StatesOf(const std::vector<BatchOp>& ops) {
  std::vector<ValueState> out(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const RespReply& r = *ops[i].data;
    switch (r.kind) {
      case RespReply::Kind::kBulk:
        out[i] = ValueState::kFilled;
        break;
      case RespReply::Kind::kWrongSize:
        out[i] = ValueState::kWrongSize;
        break;
      case RespReply::Kind::kNil:
        out[i] = ValueState::kAbsent;
        break;
      case RespReply::Kind::kError:
        return ErrorReplyStatus("redis GET", r.text);
      default:
        return Status::IOError("redis GET answered a reply that is not a value");
    }
  }
  return out;
}

std::vector<BatchOp> GetOps(std::span<const std::string> keys, const std::function<void(std::size_t)>& filled) {
  std::vector<BatchOp> ops(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ops[i].path = BatchOp::Path::kGetInto;
    ops[i].key = keys[i];
    ops[i].index = i;
    ops[i].filled = &filled;
  }
  return ops;
}

}  // namespace

Result<std::vector<ValueState>> ClusterClient::GetInto(std::span<const std::string> keys,
                                                       std::span<const std::span<std::byte>> into,
                                                       const std::function<void(std::size_t)>& filled) {
  if (keys.size() != into.size()) return Status::InvalidArgument("GetInto: one destination per key");
  std::vector<BatchOp> ops = GetOps(keys, filled);
  for (std::size_t i = 0; i < keys.size(); ++i) ops[i].into = into[i];
  PC_RETURN_IF_ERROR(impl_->RunBatch(ops));
  return StatesOf(ops);
}

Result<std::vector<ValueState>> ClusterClient::GetInto(std::span<const std::string> keys,
                                                       const std::function<std::span<std::byte>(std::size_t)>& into,
                                                       const std::function<void(std::size_t)>& filled) {
  std::vector<BatchOp> ops = GetOps(keys, filled);
  for (BatchOp& op : ops) op.provide = &into;
  PC_RETURN_IF_ERROR(impl_->RunBatch(ops));
  return StatesOf(ops);
}

Status ClusterClient::SetFrom(std::span<const std::string> keys, std::span<const std::span<const std::byte>> values) {
  if (keys.size() != values.size()) return Status::InvalidArgument("SetFrom: one value per key");
  std::vector<BatchOp> ops(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (values[i].size() > impl_->options().max_value_bytes) {
      return Status::InvalidArgument("a value of " + std::to_string(values[i].size()) +
                                     " bytes is over the limit of " + std::to_string(impl_->options().max_value_bytes));
    }
    ops[i].path = BatchOp::Path::kSetFrom;
    ops[i].key = keys[i];
    ops[i].from = values[i];
  }
  PC_RETURN_IF_ERROR(impl_->RunBatch(ops));
  for (const BatchOp& op : ops) {
    const RespReply& r = *op.data;
    if (r.kind == RespReply::Kind::kStatus && r.text == "OK") continue;
    if (r.kind == RespReply::Kind::kError) return ErrorReplyStatus("redis SET", r.text);
    return Status::IOError("redis SET answered " + (r.kind == RespReply::Kind::kStatus
                                                        ? r.text
                                                        : std::string("a reply that is not OK")));
  }
  return Status::Ok();
}

Status ClusterClient::AddMember(std::string_view key, std::string_view member) {
  return impl_->Text(key, {"SADD", std::string(key), std::string(member)}).status();
}

Status ClusterClient::RemoveMember(std::string_view key, std::string_view member) {
  return impl_->Text(key, {"SREM", std::string(key), std::string(member)}).status();
}

Result<std::vector<std::vector<std::string>>> ClusterClient::MembersMany(std::span<const std::string> keys,
                                                                         std::size_t max_members) {
  std::vector<BatchOp> ops(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) ops[i].argv = {"SMEMBERS", keys[i]};
  PC_RETURN_IF_ERROR(impl_->RunBatch(ops));
  std::vector<std::vector<std::string>> out(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    PC_ASSIGN_OR_RETURN(out[i], ReplyStrings(ops[i].reply.get(), max_members, impl_->options().max_value_bytes));
  }
  return out;
}

Result<std::vector<std::string>> ClusterClient::Keys(std::string_view pattern, std::size_t limit) {
  return impl_->Scan(pattern, limit);
}

Status ClusterClient::Refresh() { return impl_->Refresh(); }
std::vector<Endpoint> ClusterClient::Primaries() const { return impl_->Primaries(); }
Result<Endpoint> ClusterClient::PrimaryFor(std::string_view key) const { return impl_->Owner(key); }
ClusterStats ClusterClient::stats() const { return impl_->Stats(); }
bool ClusterClient::breaker_open() const { return impl_->BreakerOpen(); }
std::size_t ClusterClient::max_value_bytes() const { return impl_->options().max_value_bytes; }

}  // namespace primecache::remote
