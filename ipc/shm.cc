#include "ipc/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/errno_text.h"

namespace primecache::ipc {

ShmRegion::~ShmRegion() {
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
}

Result<std::unique_ptr<ShmRegion>> ShmRegion::Create(std::size_t size, const std::string& name) {
  if (size == 0) return Status::InvalidArgument("shared region of size 0");
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::IOError(ErrnoText("memfd_create"));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status s = Status::ResourceExhausted(ErrnoText("ftruncate memfd"));
    close(fd);
    return s;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    Status s = Status::IOError(ErrnoText("seal memfd"));
    close(fd);
    return s;
  }
  // Populated now: every page allocated and mapped at connect time, not on
  // first touch in the middle of a fetch (the daemon's first write to a page
  // would allocate and zero it there). The daemon maps the pages it is given
  // without populating: a region it did not ask for costs it nothing up front.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    Status s = Status::ResourceExhausted(ErrnoText("mmap memfd"));
    close(fd);
    return s;
  }
  return std::unique_ptr<ShmRegion>(new ShmRegion(fd, static_cast<std::byte*>(p), size));
}

Result<std::unique_ptr<ShmRegion>> ShmRegion::Adopt(int fd, std::size_t size) {
  auto fail = [fd](Status s) -> Result<std::unique_ptr<ShmRegion>> {
    close(fd);
    return s;
  };
  if (size == 0) return fail(Status::InvalidArgument("shared region of size 0"));
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return fail(Status::InvalidArgument("shared region is not a sealable memfd"));
  if ((seals & F_SEAL_SHRINK) == 0) return fail(Status::InvalidArgument("shared region is not sealed against shrinking"));
  struct stat st{};
  if (fstat(fd, &st) != 0) return fail(Status::IOError(ErrnoText("fstat shared region")));
  if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) < size) {
    return fail(Status::InvalidArgument("shared region is smaller than announced"));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail(Status::ResourceExhausted(ErrnoText("mmap shared region")));
  return std::unique_ptr<ShmRegion>(new ShmRegion(fd, static_cast<std::byte*>(p), size));
}

Status SendWithFd(int sock, std::span<const std::byte> bytes, int fd) {
  std::size_t sent = 0;
  bool fd_sent = false;
  while (sent < bytes.size()) {
    iovec iov{const_cast<std::byte*>(bytes.data() + sent), bytes.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
    if (!fd_sent) {
      msg.msg_control = ctrl;
      msg.msg_controllen = sizeof(ctrl);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Unavailable(ErrnoText("sendmsg"));
    }
    fd_sent = true;
    sent += static_cast<std::size_t>(n);
  }
  return Status::Ok();
}

}  // namespace primecache::ipc
