// RegistrationLedger: the device registrations' budget, counted per file.
#include "ipc/registration_ledger.h"

namespace primecache::ipc {

void RegistrationLedger::Uncount(Entry& e) {
  if (e.replaced) return;
  counted_ -= e.bytes;
  lru_.erase(e.lru);
  e.replaced = true;
}

void RegistrationLedger::Added(std::uint64_t id, std::uint64_t file, std::uint64_t bytes) {
  if (file != 0) {
    auto [it, fresh] = files_.try_emplace(file, id);
    if (!fresh) {
      if (auto old = regs_.find(it->second); old != regs_.end()) Uncount(old->second);
      it->second = id;
    }
  }
  Entry& e = regs_[id];
  e.file = file;
  e.bytes = bytes;
  e.users = 1;
  lru_.push_front(id);
  e.lru = lru_.begin();
  counted_ += bytes;
}

void RegistrationLedger::Used(std::uint64_t id) {
  Entry& e = regs_.at(id);
  ++e.users;
  if (!e.replaced) lru_.splice(lru_.begin(), lru_, e.lru);
}

void RegistrationLedger::Unused(std::uint64_t id) { --regs_.at(id).users; }

std::vector<std::uint64_t> RegistrationLedger::TakeEvictable() {
  std::vector<std::uint64_t> out;
  for (auto it = regs_.begin(); it != regs_.end();) {
    if (it->second.replaced && it->second.users == 0) {
      out.push_back(it->first);
      it = regs_.erase(it);
    } else {
      ++it;
    }
  }
  auto it = lru_.end();
  while (counted_ > budget_ && it != lru_.begin()) {
    --it;
    if (it == lru_.begin()) break;
    Entry& e = regs_.at(*it);
    if (e.users > 0) continue;
    const std::uint64_t id = *it;
    counted_ -= e.bytes;
    it = lru_.erase(it);
    if (auto f = files_.find(e.file); e.file != 0 && f != files_.end() && f->second == id) files_.erase(f);
    regs_.erase(id);
    out.push_back(id);
  }
  return out;
}

}  // namespace primecache::ipc
