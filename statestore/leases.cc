// Leases: a per-entry count of holders that keeps an entry from eviction and
// deletion, and the "dying" mark a removal takes so that no lease starts on
// an entry being removed.
#include "statestore/store_impl.h"

namespace primecache {

using namespace statestore_internal;  // NOLINT(google-build-using-namespace)

// ---- leases -------------------------------------------------------------------------

bool LeaseTable::TryAcquire(EntryId id) {
  MutexLock g(&mu);
  auto& slot = slots[id];
  if (slot.dying) return false;
  ++slot.count;
  ++active;
  return true;
}
void LeaseTable::Release(EntryId id) {
  MutexLock g(&mu);
  auto it = slots.find(id);
  if (it == slots.end() || it->second.count == 0) return;
  --active;
  if (--it->second.count == 0 && !it->second.dying) slots.erase(it);
}
bool LeaseTable::MarkDying(EntryId id) {
  MutexLock g(&mu);
  auto& slot = slots[id];
  if (slot.count > 0 || slot.dying) return false;
  slot.dying = true;
  return true;
}
void LeaseTable::ClearDying(EntryId id) {
  MutexLock g(&mu);
  auto it = slots.find(id);
  if (it == slots.end()) return;
  it->second.dying = false;
  if (it->second.count == 0) slots.erase(it);
}
bool LeaseTable::Leased(EntryId id) {
  MutexLock g(&mu);
  auto it = slots.find(id);
  return it != slots.end() && it->second.count > 0;
}

// ---- leases on live entries ---------------------------------------------------------------

Result<Lease> LocalStore::LeaseLive(EntryId id, std::string* record) {
  if (!impl_->leases->TryAcquire(id))
    return Status::NotFound("entry " + std::to_string(id) + " is being removed");
  Lease lease(impl_->leases, id);
  bool found = false;
  PC_RETURN_IF_ERROR(impl_->GetValue(impl_->cf_entries, IdKey(id), record, &found));
  if (!found) return Status::NotFound("no live entry " + std::to_string(id));
  return lease;
}

Result<Lease> LocalStore::AcquireLease(EntryId id) {
  std::string record;
  return LeaseLive(id, &record);
}

}  // namespace primecache
