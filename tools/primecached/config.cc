#include "tools/primecached/config.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <istream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

namespace primecache::daemon {
namespace {

std::string Join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

// One JSON value as the text a command line would carry.
std::string ValueText(const std::string& key, const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number()) return v.dump();
  throw CLI::ConfigError("config key '" + key + "': " + std::string(v.type_name()) +
                         " is not a value (expected a string, number or boolean)");
}

// "tenants": {"1000": ["a", "b"]} as --tenant's values ("1000=a,b").
std::vector<std::string> TenantSpecs(const nlohmann::json& tenants) {
  std::vector<std::string> specs;
  for (const auto& [uid, list] : tenants.items()) {
    if (!list.is_array()) throw CLI::ConfigError("config key 'tenants': uid " + uid + " needs an array of namespaces");
    std::vector<std::string> names;
    for (const auto& n : list) names.push_back(ValueText("tenants", n));
    specs.push_back(uid + "=" + Join(names, ","));
  }
  return specs;
}

// Keys that configs written before the keys were the flags used.
std::string FlagName(const std::string& key) {
  if (key == "admin_uids") return "admin-uid";
  if (key == "remote_namespaces") return "remote-ns";
  if (key == "tenants") return "tenant";
  std::string name = key;
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

}  // namespace

std::vector<CLI::ConfigItem> JsonConfig::from_config(std::istream& input) const {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(input, /*cb=*/nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const nlohmann::json::exception& e) {
    throw CLI::ConfigError(std::string("config is not JSON: ") + e.what());
  }
  if (!j.is_object()) throw CLI::ConfigError("config is not a JSON object");
  std::vector<CLI::ConfigItem> items;
  for (const auto& [key, value] : j.items()) {
    CLI::ConfigItem item;
    item.name = FlagName(key);
    if (key == "tenants" && value.is_object()) {
      item.inputs = TenantSpecs(value);
    } else if (value.is_array()) {
      for (const auto& v : value) item.inputs.push_back(ValueText(key, v));
    } else {
      item.inputs.push_back(ValueText(key, value));
    }
    items.push_back(std::move(item));
  }
  return items;
}

std::string JsonConfig::to_config(const CLI::App* app, bool default_also, bool /*write_description*/,
                                  std::string /*prefix*/) const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const CLI::Option* opt : app->get_options()) {
    if (opt->get_lnames().empty() || !opt->get_configurable()) continue;
    std::string key = opt->get_lnames().front();
    std::replace(key.begin(), key.end(), '-', '_');
    std::vector<std::string> values = opt->results();
    if (values.empty()) {
      if (!default_also || opt->get_default_str().empty()) continue;
      values.push_back(opt->get_default_str());
    }
    if (opt->get_expected_min() == 0) {  // a switch
      j[key] = values.back() == "true" || values.back() == "1";
    } else if (values.size() == 1 && opt->get_expected_max() <= 1) {
      j[key] = values.front();
    } else {
      j[key] = values;
    }
  }
  return j.dump(2) + "\n";
}

// Extras (of the command line and of the file alike) are kept, not thrown
// by CLI11, so that CheckConfigKeys names them in our words.
CLI::Option* UseJsonConfig(CLI::App* app, const std::string& option, const std::string& help) {
  app->config_formatter(std::make_shared<JsonConfig>());
  app->allow_config_extras(CLI::config_extras_mode::capture);
  app->allow_extras(true);
  return app->set_config(option, "", help);
}

Status CheckConfigKeys(const CLI::App& app) {
  std::vector<std::string> unknown = app.remaining();
  if (unknown.empty()) return Status::Ok();
  for (auto& u : unknown) {
    if (!u.empty() && u.front() != '-') std::replace(u.begin(), u.end(), '-', '_');  // a config key as it was written
  }
  return Status::InvalidArgument("unknown flag, argument or config key: " + Join(unknown, " ") +
                                 " (config keys are the long flags of primecached --help, with _ for -)");
}

std::string SettingsText(const CLI::App& app, const std::vector<std::string>& except) {
  auto j = nlohmann::ordered_json::parse(JsonConfig().to_config(&app, false, false, ""));
  for (const auto& key : except) j.erase(key);
  return j.dump();
}

Result<std::map<uid_t, std::vector<std::string>>> ParseTenants(const std::vector<std::string>& specs) {
  std::map<uid_t, std::vector<std::string>> tenants;
  for (const std::string& spec : specs) {
    const auto eq = spec.find('=');
    const std::string uid_text = spec.substr(0, eq);
    char* end = nullptr;
    errno = 0;
    const unsigned long uid = std::strtoul(uid_text.c_str(), &end, 10);
    if (eq == std::string::npos || uid_text.empty() || *end != '\0' || errno != 0 || uid > 0xffffffffUL) {
      return Status::InvalidArgument("--tenant '" + spec + "': expected UID=NS[,NS...]");
    }
    std::vector<std::string> names;
    std::stringstream rest(spec.substr(eq + 1));
    for (std::string name; std::getline(rest, name, ',');) names.push_back(name);
    if (!spec.empty() && spec.back() == ',') names.emplace_back();  // getline drops a trailing empty field
    if (names.empty()) names.emplace_back();
    auto& list = tenants[static_cast<uid_t>(uid)];
    list.insert(list.end(), names.begin(), names.end());
  }
  return tenants;
}

}  // namespace primecache::daemon
