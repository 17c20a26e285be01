// The packed-weight cache file: a 64-byte preamble, the buffers (each at a 4096-byte aligned offset),
// then a JSON header with the key and each buffer's offset and checksum.
//   preamble: "DCPACKED" | u32 version | u32 0 | u64 header_offset | u64 header_bytes | u64 header_hash
#include "model/weight_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"

namespace dc {
namespace {

constexpr char kMagic[8] = {'D', 'C', 'P', 'A', 'C', 'K', 'E', 'D'};
constexpr uint32_t kVersion = 1;
constexpr size_t kPreambleBytes = 64;
constexpr int64_t kAlign = 4096;
constexpr size_t kHashBlock = size_t{1} << 20;  // checksums are computed per MiB, in parallel
// The layouts the buffers are in (ops/weight.h); change it whenever pack_panels' output changes.
constexpr const char* kPackingFormat = "kPanels v1: bf16 64-row panels of pairs; q8/q4 32-row panels of 32-column blocks";

uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 33);
}

// A 64-bit hash of n bytes: four independent multiply-xorshift lanes over 8-byte words (memory-bound).
uint64_t hash_bytes(const uint8_t* p, size_t n) {
  constexpr uint64_t kMul = 0x9e3779b97f4a7c15ULL;
  uint64_t lane[4] = {1, 2, 3, 4};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      lane[l] = (lane[l] ^ w) * kMul;
      lane[l] ^= lane[l] >> 29;
    }
  uint64_t h = mix(n);
  for (; i < n; ++i) h = mix(h ^ p[i]);
  for (uint64_t v : lane) h = mix(h ^ v);
  return h;
}

// A buffer's checksum: the hash of its per-MiB block hashes.
uint64_t combine(const std::vector<uint64_t>& block_hashes) {
  return hash_bytes(reinterpret_cast<const uint8_t*>(block_hashes.data()), block_hashes.size() * sizeof(uint64_t));
}

int64_t n_blocks(int64_t bytes) { return (bytes + static_cast<int64_t>(kHashBlock) - 1) / static_cast<int64_t>(kHashBlock); }

// The checksums of `buffers` (sizes from `bytes`), every MiB block hashed in parallel on `pool`.
std::vector<uint64_t> checksums(const std::vector<const uint8_t*>& buffers, const std::vector<int64_t>& bytes,
                                ThreadPool* pool) {
  std::vector<std::pair<size_t, int64_t>> tasks;  // (buffer, block)
  std::vector<std::vector<uint64_t>> hashes(buffers.size());
  for (size_t b = 0; b < buffers.size(); ++b) {
    hashes[b].resize(static_cast<size_t>(n_blocks(bytes[b])));
    for (int64_t k = 0; k < n_blocks(bytes[b]); ++k) tasks.emplace_back(b, k);
  }
  parallel_for(pool, static_cast<int64_t>(tasks.size()), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const auto [b, k] = tasks[static_cast<size_t>(t)];
      const int64_t begin = k * static_cast<int64_t>(kHashBlock);
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(kHashBlock), bytes[b] - begin);
      hashes[b][static_cast<size_t>(k)] = hash_bytes(buffers[b] + begin, static_cast<size_t>(n));
    }
  });
  std::vector<uint64_t> out;
  for (const auto& h : hashes) out.push_back(combine(h));
  return out;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

nlohmann::json sources_json(const std::vector<WeightCacheKey::Source>& sources) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : sources) j.push_back({{"name", s.name}, {"size", s.size}, {"mtime_ns", s.mtime_ns}});
  return j;
}

int64_t align_up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Why the header `h` does not describe `key` ("" when it does).
std::string key_difference(const nlohmann::json& h, const WeightCacheKey& key) {
  if (h.value("packing", "") != kPackingFormat) return "it was written for another packing format";
  if (h.value("precision", "") != key.precision) return "it was packed for precision " + h.value("precision", "?");
  if (h.at("sources") != sources_json(key.sources)) return "the checkpoint's files changed since (name, size or mtime)";
  const nlohmann::json& bufs = h.at("buffers");
  if (!bufs.is_array() || bufs.size() != key.buffers.size()) return "it holds another set of matrices";
  for (size_t i = 0; i < key.buffers.size(); ++i)
    if (bufs[i].at("name") != key.buffers[i].name || bufs[i].at("bytes") != key.buffers[i].bytes)
      return "matrix " + key.buffers[i].name + " differs";
  return "";
}

}  // namespace

Result<std::vector<WeightCacheKey::Source>> weight_cache_sources(const std::string& dir,
                                                                 const std::vector<std::string>& weight_files) {
  std::vector<std::string> paths = {(std::filesystem::path(dir) / "config.json").string()};
  paths.insert(paths.end(), weight_files.begin(), weight_files.end());
  std::vector<WeightCacheKey::Source> out;
  for (const std::string& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return io_error(p + ": cannot stat: " + std::strerror(errno));
    out.push_back({std::filesystem::path(p).filename().string(), static_cast<int64_t>(st.st_size),
                   static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
  }
  return out;
}

std::string default_weight_cache_path(const std::string& dir, const std::string& precision) {
  const std::string name = "diffucoder-packed." + precision + ".bin";
  if (::access(dir.c_str(), W_OK) == 0) return (std::filesystem::path(dir) / name).string();
  std::filesystem::path base;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/') base = xdg;
  else if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/') base = std::filesystem::path(home) / ".cache";
  else return "";
  return weight_cache_path_in((base / "diffucoder").string(), dir, precision);
}

std::string weight_cache_path_in(const std::string& cache_dir, const std::string& dir, const std::string& precision) {
  std::error_code ec;
  const std::string abs = std::filesystem::weakly_canonical(dir, ec).string();
  const std::string id = hex(hash_bytes(reinterpret_cast<const uint8_t*>(abs.data()), abs.size()));
  return (std::filesystem::path(cache_dir) / (id + ".diffucoder-packed." + precision + ".bin")).string();
}

bool is_weight_cache_file_name(const std::string& file_name) { return file_name.rfind("diffucoder-packed.", 0) == 0; }

Result<WeightCacheHit> open_weight_cache(const std::string& path, const WeightCacheKey& key, ThreadPool* pool) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return not_found(path + ": no packed-weight cache");
  DC_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
  auto damaged = [&](const std::string& why) { return parse_error(path + ": damaged packed-weight cache: " + why); };
  const uint8_t* d = file.data();
  const uint64_t size = file.size();
  if (size < kPreambleBytes || std::memcmp(d, kMagic, sizeof(kMagic)) != 0) return damaged("no DCPACKED preamble");
  uint32_t version;
  uint64_t header_offset, header_bytes, header_hash;
  std::memcpy(&version, d + 8, 4);
  std::memcpy(&header_offset, d + 16, 8);
  std::memcpy(&header_bytes, d + 24, 8);
  std::memcpy(&header_hash, d + 32, 8);
  if (version != kVersion) return invalid_argument(path + ": packed-weight cache of format version " + std::to_string(version));
  if (header_offset < kPreambleBytes || header_offset > size || header_bytes > size - header_offset)
    return damaged("header outside the file (truncated?)");
  if (hash_bytes(d + header_offset, header_bytes) != header_hash) return damaged("header checksum mismatch");
  nlohmann::json h;
  std::string why;
  try {
    h = nlohmann::json::parse(d + header_offset, d + header_offset + header_bytes);
    why = key_difference(h, key);
  } catch (const nlohmann::json::exception& e) {
    return damaged(std::string("header: ") + e.what());
  }
  if (!why.empty()) return invalid_argument(path + ": stale packed-weight cache: " + why);
  WeightCacheHit hit;
  std::vector<int64_t> bytes;
  std::vector<uint64_t> expected;
  try {
    for (const nlohmann::json& b : h.at("buffers")) {
      const int64_t off = b.at("offset").get<int64_t>(), n = b.at("bytes").get<int64_t>();
      if (off < static_cast<int64_t>(kPreambleBytes) || off % kAlign != 0 || n < 0 ||
          static_cast<uint64_t>(off) > header_offset || static_cast<uint64_t>(n) > header_offset - static_cast<uint64_t>(off))
        return damaged("buffer " + b.at("name").get<std::string>() + " outside the data region");
      hit.buffers.push_back(d + off);
      bytes.push_back(n);
      expected.push_back(std::strtoull(b.at("checksum").get<std::string>().c_str(), nullptr, 16));
    }
  } catch (const nlohmann::json::exception& e) {
    return damaged(std::string("header: ") + e.what());
  }
  ::madvise(const_cast<uint8_t*>(d), size, MADV_WILLNEED);  // advice only: read ahead while we verify
  const std::vector<uint64_t> got = checksums(hit.buffers, bytes, pool);
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != expected[i]) return damaged("checksum mismatch in " + key.buffers[i].name);
  hit.file = std::move(file);
  return hit;
}

Status write_weight_cache(const std::string& path, const WeightCacheKey& key, const std::vector<const void*>& buffers,
                          std::atomic<int64_t>* bytes_written) {
  if (buffers.size() != key.buffers.size()) return invalid_argument("write_weight_cache: buffers do not match the key");
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  // Unique per writer: two engines of one process may write the same cache at once.
  static std::atomic<uint64_t> writers{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(writers++);
  const int fd = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(tmp + ": cannot create the packed-weight cache: " + std::strerror(errno));
  auto fail = [&](const std::string& why) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return io_error(tmp + ": " + why);
  };
  auto write_all = [&](const void* p, int64_t n, int64_t off) -> bool {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd, c, static_cast<size_t>(std::min<int64_t>(n, int64_t{64} << 20)), off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      c += w, n -= w, off += w;
      if (bytes_written != nullptr) *bytes_written += w;
    }
    return true;
  };
  nlohmann::json h = {{"packing", kPackingFormat}, {"precision", key.precision}, {"sources", sources_json(key.sources)}};
  nlohmann::json bufs = nlohmann::json::array();
  int64_t off = kAlign;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const int64_t n = key.buffers[i].bytes;
    const uint64_t sum = checksums({static_cast<const uint8_t*>(buffers[i])}, {n}, nullptr)[0];
    if (!write_all(buffers[i], n, off)) return fail(std::string("write failed: ") + std::strerror(errno));
    bufs.push_back({{"name", key.buffers[i].name}, {"bytes", n}, {"offset", off}, {"checksum", hex(sum)}});
    off = align_up(off + n);
  }
  h["buffers"] = std::move(bufs);
  const std::string header = h.dump();
  uint8_t pre[kPreambleBytes] = {};
  std::memcpy(pre, kMagic, sizeof(kMagic));
  const uint64_t header_offset = static_cast<uint64_t>(off), header_bytes = header.size();
  const uint64_t header_hash = hash_bytes(reinterpret_cast<const uint8_t*>(header.data()), header.size());
  std::memcpy(pre + 8, &kVersion, 4);
  std::memcpy(pre + 16, &header_offset, 8);
  std::memcpy(pre + 24, &header_bytes, 8);
  std::memcpy(pre + 32, &header_hash, 8);
  if (!write_all(header.data(), static_cast<int64_t>(header.size()), off) || !write_all(pre, kPreambleBytes, 0))
    return fail(std::string("write failed: ") + std::strerror(errno));
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return io_error(tmp + ": close failed: " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return io_error(path + ": cannot rename the packed-weight cache into place: " + std::strerror(err));
  }
  return Status();
}

}  // namespace dc
