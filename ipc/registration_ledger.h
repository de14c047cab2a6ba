// RegistrationLedger: the accounting of the daemon's device registrations
// (DeviceDma): which registered mappings count against the byte budget, in
// which order they are let go, and which may be let go now. No CUDA here,
// so that it is tested without a device (tests/ipc/registration_ledger_test.cc).
//
// A registration is counted once per file: a segment that grew is mapped
// again, longer, under a new mapping id, and registering that mapping
// replaces the shorter one's in the count; the shorter one is let go once no
// copy uses it (it stays registered, uncounted, until then). Past the
// budget, the least recently used registrations no copy uses are let go;
// the most recently used one always stays.
//
// Thread-safety: none; DeviceDma calls it under its own lock.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <vector>

namespace primecache::ipc {

class RegistrationLedger {
 public:
  explicit RegistrationLedger(std::uint64_t budget) : budget_(budget) {}

  // Mapping `id` (`bytes` of file `file`; 0: a file of its own) was
  // registered, with one user; it is the most recently used. A registration
  // of the same file counted before is counted no longer.
  void Added(std::uint64_t id, std::uint64_t file, std::uint64_t bytes);
  // One more user of `id` (known here), now the most recently used; one fewer.
  void Used(std::uint64_t id);
  void Unused(std::uint64_t id);
  // The registrations to unregister now, forgotten here: replaced ones no
  // copy uses, then, while the counted bytes exceed the budget, the least
  // recently used ones no copy uses (never the most recent).
  std::vector<std::uint64_t> TakeEvictable();

  // Bytes counted against the budget: one registration per file.
  std::uint64_t counted_bytes() const { return counted_; }
  bool Has(std::uint64_t id) const { return regs_.count(id) != 0; }

 private:
  struct Entry {
    std::uint64_t file = 0, bytes = 0;
    int users = 0;
    bool replaced = false;                 // a longer mapping of its file is counted instead
    std::list<std::uint64_t>::iterator lru;  // when not replaced
  };
  void Uncount(Entry& e);

  const std::uint64_t budget_;
  std::map<std::uint64_t, Entry> regs_;          // by mapping id
  std::map<std::uint64_t, std::uint64_t> files_;  // file -> the counted mapping id
  std::list<std::uint64_t> lru_;                 // counted ones; front: most recent
  std::uint64_t counted_ = 0;
};

}  // namespace primecache::ipc
