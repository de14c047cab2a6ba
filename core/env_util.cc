// Helpers layered on any Env.
#include <atomic>
#include <cstring>

#include <unistd.h>

#include "primecache/env.h"

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

}  // namespace primecache
