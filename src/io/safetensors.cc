// Safetensors header validation (every check names the file and the tensor) and the atomic writer.
#include "io/safetensors.h"

#include "io/atomic_dir.h"

#include <algorithm>
#include <bit>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

namespace dc {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swapping");

using Json = nlohmann::json;

const char* json_type_name(const Json& j) { return j.type_name(); }

// Maps a safetensors dtype string to DType; kUnimplemented for the other known safetensors dtypes.
Status parse_dtype(const std::string& s, const std::string& where, DType* out) {
  if (s == "F32") { *out = DType::kF32; return Status::ok_status(); }
  if (s == "F16") { *out = DType::kF16; return Status::ok_status(); }
  if (s == "BF16") { *out = DType::kBF16; return Status::ok_status(); }
  if (s == "I8") { *out = DType::kI8; return Status::ok_status(); }   // quantized weight codes
  if (s == "U8") { *out = DType::kU8; return Status::ok_status(); }   // packed 4-bit codes
  static const std::set<std::string> kKnown = {"BOOL", "I16",     "U16",     "I32",     "U32",     "I64",
                                               "U64",  "F64",     "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3",
                                               "F6_E3M2", "F4", "C64"};
  if (kKnown.count(s)) {
    return unimplemented(where + " has dtype " + s + ", which is not supported (only F32, F16, BF16, I8 and U8); " +
                         "convert the checkpoint to one of those");
  }
  return parse_error(where + " has unknown dtype \"" + s + "\" (expected F32, F16, BF16, I8 or U8)");
}

// product(shape) * dtype_size(dtype) into *out (0 when a dim is 0); false when it overflows 64 bits.
// Precondition: no dim is negative.
bool byte_count(const std::vector<int64_t>& shape, DType dtype, uint64_t* out) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    *out = 0;
    return true;
  }
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

// Reads a non-negative JSON integer.
bool get_u64(const Json& j, uint64_t* out) {
  if (!j.is_number_unsigned()) return false;
  *out = j.get<uint64_t>();
  return true;
}

// Validates one tensor entry of the header and fills `info` (data left for the caller).
Status parse_entry(const std::string& path, const std::string& name, const Json& entry, size_t buffer_size,
                   TensorInfo* info, uint64_t* begin_out, uint64_t* end_out) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!entry.is_object()) {
    return parse_error(where + " must be a JSON object with dtype, shape and data_offsets, got " +
                       json_type_name(entry));
  }
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end()) return parse_error(where + " has no \"dtype\" field");
  if (shape_it == entry.end()) return parse_error(where + " has no \"shape\" field");
  if (offsets_it == entry.end()) return parse_error(where + " has no \"data_offsets\" field");
  if (!dtype_it->is_string()) {
    return parse_error(where + ": \"dtype\" must be a string such as \"BF16\", got " + json_type_name(*dtype_it));
  }
  DC_RETURN_IF_ERROR(parse_dtype(dtype_it->get<std::string>(), where, &info->dtype));

  if (!shape_it->is_array()) {
    return parse_error(where + ": \"shape\" must be an array of non-negative integers, got " +
                       json_type_name(*shape_it));
  }
  for (const Json& d : *shape_it) {
    uint64_t dim;
    if (!get_u64(d, &dim) || dim > static_cast<uint64_t>(INT64_MAX)) {
      return parse_error(where + ": \"shape\" must hold non-negative integers, found a " + json_type_name(d) +
                         (d.is_number_integer() ? " below zero" : ""));
    }
    info->shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t n_bytes = 0;
  if (!byte_count(info->shape, info->dtype, &n_bytes)) {
    return parse_error(where + ": the byte size of \"shape\" overflows 64 bits");
  }

  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    return parse_error(where + ": \"data_offsets\" must be an array [begin, end] of two non-negative integers");
  }
  uint64_t begin, end;
  if (!get_u64((*offsets_it)[0], &begin) || !get_u64((*offsets_it)[1], &end)) {
    return parse_error(where + ": \"data_offsets\" must hold two non-negative integers");
  }
  if (begin > end) {
    return parse_error(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                       "] has begin > end");
  }
  if (end > buffer_size) {
    return parse_error(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                       "] run past the end of the data buffer (" + std::to_string(buffer_size) +
                       " bytes); the file is truncated or corrupt");
  }
  if (end - begin != n_bytes) {
    return parse_error(where + ": data_offsets span " + std::to_string(end - begin) + " bytes but " +
                       dtype_name(info->dtype) + " shape needs " + std::to_string(n_bytes) + " bytes");
  }
  info->name = name;
  info->n_bytes = static_cast<size_t>(n_bytes);
  info->file = path;
  *begin_out = begin;
  *end_out = end;
  return Status::ok_status();
}

Status parse_metadata(const std::string& path, const Json& j, std::map<std::string, std::string>* out) {
  if (j.is_null()) return Status::ok_status();
  if (!j.is_object()) {
    return parse_error(path + ": \"__metadata__\" must be an object of string values, got " + json_type_name(j));
  }
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string()) {
      return parse_error(path + ": \"__metadata__\" entry '" + key + "' must be a string, got " +
                         json_type_name(value));
    }
    (*out)[key] = value.get<std::string>();
  }
  return Status::ok_status();
}

// Parses the header JSON, rejecting duplicate keys at any depth (plain parsing keeps the last one).
Status parse_header_json(const std::string& path, std::string_view text, Json* out) {
  std::vector<std::set<std::string>> keys_stack;
  std::string duplicate;
  auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      keys_stack.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      if (!keys_stack.empty()) keys_stack.pop_back();
    } else if (event == Json::parse_event_t::key && !keys_stack.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys_stack.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  try {
    *out = Json::parse(text.begin(), text.end(), callback);
  } catch (const std::exception& e) {
    return parse_error(path + ": the safetensors header is not valid JSON (" + e.what() +
                       "); the file is corrupt or not safetensors");
  }
  if (!duplicate.empty()) return parse_error(path + ": the safetensors header has the key '" + duplicate + "' twice");
  if (!out->is_object()) {
    return parse_error(path + ": the safetensors header must be a JSON object, got " + json_type_name(*out));
  }
  return Status::ok_status();
}

}  // namespace

Result<ParsedSafetensors> parse_safetensors(const uint8_t* bytes, size_t size, const std::string& path) {
  if (size < 8) {
    return parse_error(path + ": file is " + std::to_string(size) +
                       " bytes, too short for safetensors (it starts with an 8-byte header length); "
                       "is the download complete?");
  }
  uint64_t n_header = 0;
  for (int i = 7; i >= 0; --i) n_header = (n_header << 8) | bytes[i];
  if (n_header > kMaxSafetensorsHeaderBytes) {
    return parse_error(path + ": header length " + std::to_string(n_header) + " exceeds the limit of " +
                       std::to_string(kMaxSafetensorsHeaderBytes) + " bytes; the file is corrupt or not safetensors");
  }
  if (n_header > size - 8) {
    return parse_error(path + ": header length " + std::to_string(n_header) + " runs past the end of the file (" +
                       std::to_string(size) + " bytes); the file is truncated or not safetensors");
  }
  Json header;
  DC_RETURN_IF_ERROR(parse_header_json(
      path, std::string_view(reinterpret_cast<const char*>(bytes) + 8, static_cast<size_t>(n_header)), &header));

  ParsedSafetensors parsed;
  parsed.buffer_offset = 8 + static_cast<size_t>(n_header);
  const uint8_t* buffer = bytes + parsed.buffer_offset;
  const size_t buffer_size = size - parsed.buffer_offset;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges;  // non-empty [begin, end), name
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      DC_RETURN_IF_ERROR(parse_metadata(path, entry, &parsed.metadata));
      continue;
    }
    TensorInfo info;
    uint64_t begin = 0, end = 0;
    DC_RETURN_IF_ERROR(parse_entry(path, name, entry, buffer_size, &info, &begin, &end));
    info.data = buffer + begin;
    if (end > begin) ranges.emplace_back(begin, end, name);
    parsed.tensors.emplace(name, std::move(info));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& [prev_begin, prev_end, prev_name] = ranges[i - 1];
    const auto& [begin, end, name] = ranges[i];
    if (begin < prev_end) {
      return parse_error(path + ": tensors '" + prev_name + "' [" + std::to_string(prev_begin) + ", " +
                         std::to_string(prev_end) + ") and '" + name + "' [" + std::to_string(begin) + ", " +
                         std::to_string(end) + ") overlap in the data buffer; the file is corrupt");
    }
  }
  return parsed;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  DC_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  DC_ASSIGN_OR_RETURN(ParsedSafetensors parsed, parse_safetensors(mapped.data(), mapped.size(), path));
  SafetensorsFile file;
  file.file_ = std::move(mapped);  // the mapping's address does not change, so the data pointers stay valid
  file.parsed_ = std::move(parsed);
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = parsed_.tensors.find(std::string(name));
  return it == parsed_.tensors.end() ? nullptr : &it->second;
}

// ---- writer ----------------------------------------------------------------------------------------

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<size_t> n_bytes(tensors.size());
  std::set<std::string_view> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToWrite& t = tensors[i];
    const std::string where = "writing " + path + ": tensor '" + t.name + "'";
    if (t.name.empty() || t.name == "__metadata__") {
      return invalid_argument("writing " + path + ": tensor #" + std::to_string(i) +
                              " has the reserved or empty name '" + t.name + "'; give it a real name");
    }
    if (!names.insert(t.name).second) return invalid_argument(where + " appears twice; tensor names must be unique");
    for (int64_t d : t.shape) {
      if (d < 0) return invalid_argument(where + " has a negative dimension " + std::to_string(d));
    }
    uint64_t n = 0;
    if (!byte_count(t.shape, t.dtype, &n)) return invalid_argument(where + ": its byte size overflows 64 bits");
    if (n > 0 && t.data == nullptr) {
      return invalid_argument(where + " has no data (nullptr) but holds " + std::to_string(n) + " bytes");
    }
    n_bytes[i] = static_cast<size_t>(n);
  }

  // Largest element size first, then by name: every offset is then a multiple of its element size.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const size_t sa = dtype_size(tensors[a].dtype), sb = dtype_size(tensors[b].dtype);
    return sa != sb ? sa > sb : tensors[a].name < tensors[b].name;
  });
  Json header = Json::object();
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorToWrite& t = tensors[i];
    if (__builtin_add_overflow(offset, static_cast<uint64_t>(n_bytes[i]), &offset)) {
      return invalid_argument("writing " + path + ": the total size of the tensors overflows");
    }
    header[t.name] = Json{{"dtype", dtype_name(t.dtype)}, {"shape", t.shape},
                          {"data_offsets", {offset - n_bytes[i], offset}}};
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const std::exception& e) {
    return invalid_argument("writing " + path + ": a tensor name or metadata entry is not valid UTF-8 (" + e.what() +
                            ")");
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // the buffer then starts 8-aligned

  return write_file_atomically(path, [&](const ByteSink& sink) -> Status {
    uint8_t prefix[8];
    const uint64_t n_header = header_text.size();
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(n_header >> (8 * i));
    DC_RETURN_IF_ERROR(sink(prefix, 8));
    DC_RETURN_IF_ERROR(sink(header_text.data(), header_text.size()));
    for (size_t i : order) DC_RETURN_IF_ERROR(sink(tensors[i].data, n_bytes[i]));
    return Status::ok_status();
  });
}

}  // namespace dc
