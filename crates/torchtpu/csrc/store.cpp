// The process group's store (a c10d::Store), for the Rust core: a PJRT client
// spanning several processes (GPUs) exchanges its topology and collective ids
// through it. The plugin calls it from its own threads, so these calls take no
// GIL; a store written in Python takes it itself (PyTorch's trampoline).
#include "ffi.h"

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

StorePtr& of(void* store) {
  return *static_cast<StorePtr*>(store);
}

int32_t answer(int32_t code, const void* data, size_t n, char** bytes, size_t* size) {
  *bytes = static_cast<char*>(std::malloc(n ? n : 1));
  if (n) std::memcpy(*bytes, data, n);
  *size = n;
  return code;
}

int32_t failed(int32_t code, const std::exception& e, char** bytes, size_t* size) {
  // c10 errors' what() carries a C++ backtrace too.
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string message = c10_error ? c10_error->what_without_backtrace() : e.what();
  return answer(code, message.data(), message.size(), bytes, size);
}

int32_t value(const StorePtr& store, const std::string& key, char** bytes, size_t* size) {
  const std::vector<uint8_t> v = store->get(key);
  return answer(0, v.data(), v.size(), bytes, size);
}

}  // namespace

extern "C" {

void* tt_store_adopt(void* store_object) {
  try {
    auto store = pybind11::handle(static_cast<PyObject*>(store_object)).cast<StorePtr>();
    return store ? new StorePtr(std::move(store)) : nullptr;
  } catch (const pybind11::cast_error&) {
    return nullptr;
  }
}

void tt_store_release(void* store) {
  delete static_cast<StorePtr*>(store);
}

int32_t tt_store_get(void* store, const char* key, size_t key_size, int64_t timeout_ms, char** bytes, size_t* size) {
  const std::string k(key, key_size);
  try {
    of(store)->wait({k}, std::chrono::milliseconds(timeout_ms));
  } catch (const std::exception& e) {
    return failed(TT_STORE_TIMEOUT, e, bytes, size);
  }
  try {
    return value(of(store), k, bytes, size);
  } catch (const std::exception& e) {
    return failed(TT_STORE_FAILED, e, bytes, size);
  }
}

int32_t tt_store_try_get(void* store, const char* key, size_t key_size, char** bytes, size_t* size) {
  const std::string k(key, key_size);
  try {
    if (!of(store)->check({k})) return answer(TT_STORE_MISSING, nullptr, 0, bytes, size);
    return value(of(store), k, bytes, size);
  } catch (const std::exception& e) {
    return failed(TT_STORE_FAILED, e, bytes, size);
  }
}

int32_t tt_store_put(void* store, const char* key, size_t key_size, const char* value, size_t value_size,
                     char** bytes, size_t* size) {
  try {
    of(store)->set(std::string(key, key_size), std::vector<uint8_t>(value, value + value_size));
    return 0;
  } catch (const std::exception& e) {
    return failed(TT_STORE_FAILED, e, bytes, size);
  }
}

void tt_store_free(char* bytes) {
  std::free(bytes);
}

}  // extern "C"
