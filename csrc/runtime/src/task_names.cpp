// Interned task names: Note [Task names] (internal.h).
#include "internal.h"

#include <array>
#include <cstring>
#include <unordered_set>

namespace vnpu::rt {

const char* intern_task_name(const char* name) {
  // A per-thread cache keyed by the caller's pointer (callers pass the same
  // buffer for the same op); a hit is confirmed by the text, since a buffer
  // can be reused for another name.
  struct Entry {
    const char* key = nullptr;
    const char* interned = nullptr;
  };
  thread_local std::array<Entry, 64> cache;
  Entry& e = cache[(reinterpret_cast<uintptr_t>(name) >> 4) % cache.size()];
  if (e.key == name && std::strcmp(e.interned, name) == 0) return e.interned;
  static std::mutex mu;
  // Never destroyed: workers may still name tasks while statics are torn down at exit.
  static auto* names = new std::unordered_set<std::string>();
  const char* interned;
  {
    std::lock_guard<std::mutex> g(mu);
    interned = names->emplace(name).first->c_str();  // nodes never move: stable
  }
  e = {name, interned};
  return interned;
}

}  // namespace vnpu::rt
