// A store's RocksDB opened directly, behind the store's back (the store
// closed), for tests that plant damage or read records as they are on disk.
#pragma once

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <memory>
#include <string>
#include <vector>

#include "primecache/internal/env.h"
#include "statestore/rocks_env.h"

namespace primecache::store_test {

// The database at `path`, over `env` (the store's own Env), every column
// family open; compactions off, so the files listed stay the files there.
class RawDb {
 public:
  explicit RawDb(Env* env, const std::string& path) {
    fs_ = statestore_internal::NewEnvFileSystem(env, {});
    renv_ = statestore_internal::NewRocksEnv(fs_, false);
    rocksdb::DBOptions o;
    o.env = renv_.get();
    std::vector<std::string> names;
    EXPECT_TRUE(rocksdb::DB::ListColumnFamilies(o, path, &names).ok());
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
    rocksdb::ColumnFamilyOptions cfo;
    cfo.disable_auto_compactions = true;  // the files listed stay the files there
    for (auto& n : names) cfs.emplace_back(n, cfo);
    rocksdb::Status s = rocksdb::DB::Open(o, path, cfs, &handles_, &db_);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  ~RawDb() {
    for (auto* h : handles_) (void)db_->DestroyColumnFamilyHandle(h);
    delete db_;
  }
  rocksdb::ColumnFamilyHandle* cf(const std::string& name) {
    for (auto* h : handles_) {
      if (h->GetName() == name) return h;
    }
    ADD_FAILURE() << "no column family " << name;
    return nullptr;
  }
  std::string Get(const std::string& cfname, const std::string& key) {
    std::string v;
    EXPECT_TRUE(db_->Get(rocksdb::ReadOptions(), cf(cfname), key, &v).ok()) << cfname;
    return v;
  }
  void Put(const std::string& cfname, const std::string& key, const std::string& value) {
    EXPECT_TRUE(db_->Put(rocksdb::WriteOptions(), cf(cfname), key, value).ok());
  }
  void Delete(const std::string& cfname, const std::string& key) {
    EXPECT_TRUE(db_->Delete(rocksdb::WriteOptions(), cf(cfname), key).ok());
  }
  // Deletes every key of `cfname` that starts with `prefix`; how many.
  std::size_t DeletePrefix(const std::string& cfname, const std::string& prefix) {
    std::vector<std::string> keys;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf(cfname)));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) keys.push_back(it->key().ToString());
    for (const auto& k : keys) Delete(cfname, k);
    return keys.size();
  }
  rocksdb::DB* db() { return db_; }

 private:
  std::shared_ptr<rocksdb::FileSystem> fs_;
  std::unique_ptr<rocksdb::Env> renv_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  rocksdb::DB* db_ = nullptr;
};

}  // namespace primecache::store_test
