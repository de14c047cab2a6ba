// Helpers layered on any Env.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include "primecache/internal/env.h"

namespace primecache {

std::string DirName(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  auto slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

Status CreateDirs(Env* env, const std::string& path) {
  if (path.empty() || env->FileExists(path)) return Status::Ok();
  std::string parent = DirName(path);
  if (parent != path) PC_RETURN_IF_ERROR(CreateDirs(env, parent));
  return env->CreateDir(path);
}

Result<FileMode> Env::GetFileMode(const std::string& path) {
  return Status::NotSupported("this Env keeps no permissions (" + path + ")");
}

Status Env::SetPermissions(const std::string& path, std::uint32_t) {
  return Status::NotSupported("this Env keeps no permissions (" + path + ")");
}

Status Env::TruncateFile(const std::string& path, std::uint64_t) {
  return Status::NotSupported("this Env cannot truncate files (" + path + ")");
}

bool Env::IsResident(const MappedRegion&, std::uint64_t, std::uint64_t) { return true; }

Result<MappedRegion> RandomAccessFile::Map(std::uint64_t) const {
  return Status::NotSupported("this Env cannot map files");
}

std::uint64_t NextMappingId() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1);
}

namespace {

constexpr int kMaxRestrictDepth = 16;

// Deeper than `levels` nothing is walked: a private directory already keeps
// other users from everything under it.
Status RestrictTree(Env* env, const std::string& path, int levels, std::vector<TightenedPath>* out) {
  auto mode = env->GetFileMode(path);
  if (!mode.ok()) {
    if (mode.status().IsNotFound()) return Status::Ok();  // removed meanwhile
    return mode.status();
  }
  if (mode->kind == FileMode::Kind::kOther) return Status::Ok();
  if ((mode->permissions & 077) != 0) {
    const std::uint32_t tight = mode->permissions & 0700;
    PC_RETURN_IF_ERROR(env->SetPermissions(path, tight));
    out->push_back({path, mode->permissions, tight});
  }
  if (mode->kind != FileMode::Kind::kDirectory || levels == 0) return Status::Ok();
  PC_ASSIGN_OR_RETURN(std::vector<std::string> children, env->GetChildren(path));
  for (const std::string& c : children)
    PC_RETURN_IF_ERROR(RestrictTree(env, path + "/" + c, levels - 1, out));
  return Status::Ok();
}

}  // namespace

Result<std::vector<TightenedPath>> RestrictToOwner(Env* env, const std::string& path, bool recursive) {
  std::vector<TightenedPath> changed;
  auto probe = env->GetFileMode(path);
  if (!probe.ok() && probe.status().code() == StatusCode::kNotSupported) return changed;
  PC_RETURN_IF_ERROR(RestrictTree(env, path, recursive ? kMaxRestrictDepth : 0, &changed)
                         .WithContext("making " + path + " private"));
  return changed;
}

std::string DescribeTightened(const std::vector<TightenedPath>& changed) {
  constexpr std::size_t kShown = 4;
  auto octal = [](std::uint32_t m) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "%04o", m);
    return std::string(buf);
  };
  std::string out = std::to_string(changed.size()) + (changed.size() == 1 ? " path: " : " paths: ");
  for (std::size_t i = 0; i < changed.size() && i < kShown; ++i) {
    if (i > 0) out += ", ";
    out += changed[i].path + " " + octal(changed[i].old_permissions) + " -> " +
           octal(changed[i].new_permissions);
  }
  if (changed.size() > kShown) out += ", ...";
  return out;
}

Result<std::string> ReadFileToString(Env* env, const std::string& path) {
  PC_ASSIGN_OR_RETURN(auto file, env->NewSequentialFile(path));
  std::string out;
  constexpr std::size_t kChunk = 1 << 16;
  for (;;) {
    std::size_t old = out.size();
    out.resize(old + kChunk);
    std::size_t got = 0;
    Status s = file->Read({reinterpret_cast<std::byte*>(out.data()) + old, kChunk}, &got);
    out.resize(old + got);
    if (!s.ok()) return s;
    if (got < kChunk) break;
  }
  return out;
}

Status WriteFileAtomically(Env* env, const std::string& path, std::string_view data) {
  static std::atomic<std::uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  Status s = [&]() -> Status {
    PC_ASSIGN_OR_RETURN(auto file, env->NewWritableFile(tmp));
    PC_RETURN_IF_ERROR(file->Append({reinterpret_cast<const std::byte*>(data.data()), data.size()}));
    PC_RETURN_IF_ERROR(file->Sync());
    PC_RETURN_IF_ERROR(file->Close());
    PC_RETURN_IF_ERROR(env->RenameFile(tmp, path));
    return env->SyncDir(DirName(path));
  }();
  if (!s.ok() && env->FileExists(tmp)) (void)env->RemoveFile(tmp);
  return s.WithContext("writing " + path);
}

Result<std::string> DefaultDataDir() {
  const char* xdg = std::getenv("XDG_DATA_HOME");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/primecache";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') return std::string(home) + "/.local/share/primecache";
  return Status::FailedPrecondition("no data directory: neither XDG_DATA_HOME (absolute) nor HOME is set");
}

}  // namespace primecache
