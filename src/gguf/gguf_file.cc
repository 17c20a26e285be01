// The GGUF reader: a bounds-checked cursor over the mapped bytes, then the checks of the tensor table.
#include "gguf/gguf_file.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

namespace dc {

std::optional<GgufTypeInfo> gguf_type_info(uint32_t type) {
  switch (static_cast<GgufType>(type)) {
    case GgufType::kF32: return GgufTypeInfo{"F32", 1, 4};
    case GgufType::kF16: return GgufTypeInfo{"F16", 1, 2};
    case GgufType::kBF16: return GgufTypeInfo{"BF16", 1, 2};
    case GgufType::kQ8_0: return GgufTypeInfo{"Q8_0", 32, 34};
    case GgufType::kQ4_0: return GgufTypeInfo{"Q4_0", 32, 18};
    case GgufType::kQ4_1: return GgufTypeInfo{"Q4_1", 32, 20};
    case GgufType::kQ5_0: return GgufTypeInfo{"Q5_0", 32, 22};
    case GgufType::kQ5_1: return GgufTypeInfo{"Q5_1", 32, 24};
    case GgufType::kQ2_K: return GgufTypeInfo{"Q2_K", 256, 84};
    case GgufType::kQ3_K: return GgufTypeInfo{"Q3_K", 256, 110};
    case GgufType::kQ4_K: return GgufTypeInfo{"Q4_K", 256, 144};
    case GgufType::kQ5_K: return GgufTypeInfo{"Q5_K", 256, 176};
    case GgufType::kQ6_K: return GgufTypeInfo{"Q6_K", 256, 210};
  }
  return std::nullopt;
}

const char* gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8: return "uint8";
    case GgufValueType::kI8: return "int8";
    case GgufValueType::kU16: return "uint16";
    case GgufValueType::kI16: return "int16";
    case GgufValueType::kU32: return "uint32";
    case GgufValueType::kI32: return "int32";
    case GgufValueType::kF32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kU64: return "uint64";
    case GgufValueType::kI64: return "int64";
    case GgufValueType::kF64: return "float64";
  }
  return "unknown";
}

namespace {

// Bytes of one element of a fixed-size value type; 0 for strings, arrays and unknown ids.
size_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kBool: return 1;
    case GgufValueType::kU16: case GgufValueType::kI16: return 2;
    case GgufValueType::kU32: case GgufValueType::kI32: case GgufValueType::kF32: return 4;
    case GgufValueType::kU64: case GgufValueType::kI64: case GgufValueType::kF64: return 8;
    default: return 0;
  }
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kF64); }

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Reads a scalar of type t at p into value (i / f); false for a u64 above INT64_MAX.
bool read_scalar(GgufValueType t, const uint8_t* p, GgufValue* v) {
  switch (t) {
    case GgufValueType::kU8: v->i = load<uint8_t>(p); return true;
    case GgufValueType::kI8: v->i = load<int8_t>(p); return true;
    case GgufValueType::kBool: v->i = load<uint8_t>(p) != 0; return true;
    case GgufValueType::kU16: v->i = load<uint16_t>(p); return true;
    case GgufValueType::kI16: v->i = load<int16_t>(p); return true;
    case GgufValueType::kU32: v->i = load<uint32_t>(p); return true;
    case GgufValueType::kI32: v->i = load<int32_t>(p); return true;
    case GgufValueType::kI64: v->i = load<int64_t>(p); return true;
    case GgufValueType::kU64: {
      const uint64_t u = load<uint64_t>(p);
      v->i = static_cast<int64_t>(u);
      return u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    }
    case GgufValueType::kF32: v->f = load<float>(p); return true;
    case GgufValueType::kF64: v->f = load<double>(p); return true;
    default: return false;
  }
}

class Cursor {
 public:
  Cursor(const uint8_t* bytes, size_t size, const std::string& path) : p_(bytes), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }
  Status error(const std::string& what) const {
    return parse_error(path_ + ": " + what + " (at byte " + std::to_string(pos_) + " of " + std::to_string(size_) +
                       "); the file is damaged, truncated or not a GGUF model");
  }
  Status need(size_t n, const std::string& what) const {
    if (n > left()) return error("truncated: " + what + " needs " + std::to_string(n) + " bytes, " +
                                 std::to_string(left()) + " left");
    return Status();
  }
  template <typename T>
  Result<T> read(const std::string& what) {
    DC_RETURN_IF_ERROR(need(sizeof(T), what));
    const T v = load<T>(p_ + pos_);
    pos_ += sizeof(T);
    return v;
  }
  Result<std::string_view> string(const std::string& what) {
    DC_ASSIGN_OR_RETURN(uint64_t n, read<uint64_t>(what + " length"));
    if (n > kMaxGgufStringBytes) return error(what + " claims " + std::to_string(n) + " bytes, over the limit");
    DC_RETURN_IF_ERROR(need(static_cast<size_t>(n), what));
    const std::string_view s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  const uint8_t* here() const { return p_ + pos_; }
  void skip(size_t n) { pos_ += n; }

  // One value of type `t` (arrays recursively, `depth` deep so far) for metadata key `key`.
  Result<GgufValue> value(uint32_t t, const std::string& key, int depth) {
    if (!known_value_type(t)) return error("metadata '" + key + "' has unknown value type " + std::to_string(t));
    GgufValue v;
    v.type = static_cast<GgufValueType>(t);
    if (v.type == GgufValueType::kString) {
      DC_ASSIGN_OR_RETURN(v.s, string("metadata '" + key + "' string"));
      return v;
    }
    if (v.type != GgufValueType::kArray) {
      const size_t n = scalar_size(v.type);
      DC_RETURN_IF_ERROR(need(n, "metadata '" + key + "' value"));
      if (!read_scalar(v.type, here(), &v)) return error("metadata '" + key + "' is a uint64 above 2^63 - 1");
      skip(n);
      return v;
    }
    if (depth >= kMaxGgufArrayDepth) return error("metadata '" + key + "' nests arrays too deep");
    DC_ASSIGN_OR_RETURN(uint32_t et, read<uint32_t>("metadata '" + key + "' array type"));
    if (!known_value_type(et)) return error("metadata '" + key + "' is an array of unknown type " + std::to_string(et));
    v.elem = static_cast<GgufValueType>(et);
    DC_ASSIGN_OR_RETURN(v.n, read<uint64_t>("metadata '" + key + "' array length"));
    const size_t elem_size = scalar_size(v.elem);
    // Every element takes at least 8 bytes (strings, arrays) or its scalar size: a count the rest of the
    // file cannot hold is refused before anything is sized by it.
    const uint64_t min_bytes = elem_size != 0 ? elem_size : 8;
    if (v.n > left() / min_bytes)
      return error("metadata '" + key + "' claims " + std::to_string(v.n) + " elements, more than the file holds");
    if (v.n > kMaxGgufArrayElements)
      return error("metadata '" + key + "' claims " + std::to_string(v.n) + " elements, over the limit of " +
                   std::to_string(kMaxGgufArrayElements));
    if (elem_size != 0) {
      v.raw = here();
      for (uint64_t k = 0; k < v.n; ++k) {
        GgufValue probe;
        if (!read_scalar(v.elem, v.raw + k * elem_size, &probe))
          return error("metadata '" + key + "' holds a uint64 above 2^63 - 1");
      }
      skip(static_cast<size_t>(v.n * elem_size));
    } else if (v.elem == GgufValueType::kString) {
      v.strings.reserve(static_cast<size_t>(v.n));
      for (uint64_t k = 0; k < v.n; ++k) {
        DC_ASSIGN_OR_RETURN(std::string_view s, string("metadata '" + key + "' element " + std::to_string(k)));
        v.strings.push_back(s);
      }
    } else {
      nested_arrays_ += v.n;
      if (nested_arrays_ > kMaxGgufNestedArrays)
        return error("metadata '" + key + "' nests more than " + std::to_string(kMaxGgufNestedArrays) +
                     " arrays in the file");
      for (uint64_t k = 0; k < v.n; ++k) {
        DC_ASSIGN_OR_RETURN(GgufValue item, value(static_cast<uint32_t>(GgufValueType::kArray),
                                                  key + "[" + std::to_string(k) + "]", depth + 1));
        v.items.push_back(std::move(item));
      }
    }
    return v;
  }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  uint64_t nested_arrays_ = 0;  // arrays inside arrays read so far
  const std::string& path_;
};

}  // namespace

bool GgufValue::is_integer() const {
  return type != GgufValueType::kF32 && type != GgufValueType::kF64 && type != GgufValueType::kString &&
         type != GgufValueType::kArray;
}

int64_t GgufValue::int_at(uint64_t k) const {
  GgufValue v;
  read_scalar(elem, raw + k * scalar_size(elem), &v);
  return v.i;
}

Result<ParsedGguf> parse_gguf(const uint8_t* bytes, size_t size, const std::string& path) {
  Cursor c(bytes, size, path);
  ParsedGguf g;
  DC_RETURN_IF_ERROR(c.need(4, "the magic"));
  if (std::memcmp(bytes, "GGUF", 4) != 0) return c.error("wrong magic: not a GGUF file (it does not start with \"GGUF\")");
  c.skip(4);
  DC_ASSIGN_OR_RETURN(g.version, c.read<uint32_t>("the version"));
  if (g.version != 2 && g.version != 3)
    return parse_error(path + ": GGUF version " + std::to_string(g.version) +
                       " is not supported (2 and 3 are; a big-endian file or one from before 2023-08 needs re-converting)");
  DC_ASSIGN_OR_RETURN(uint64_t n_tensors, c.read<uint64_t>("the tensor count"));
  DC_ASSIGN_OR_RETURN(uint64_t n_kv, c.read<uint64_t>("the metadata count"));
  if (n_tensors > kMaxGgufTensors || n_tensors > c.left() / 24)
    return c.error("tensor count " + std::to_string(n_tensors) + " is absurd for the file");
  if (n_kv > kMaxGgufMetadata || n_kv > c.left() / 12)
    return c.error("metadata count " + std::to_string(n_kv) + " is absurd for the file");

  for (uint64_t k = 0; k < n_kv; ++k) {
    DC_ASSIGN_OR_RETURN(std::string_view key, c.string("metadata key " + std::to_string(k)));
    const std::string name(key);
    DC_ASSIGN_OR_RETURN(uint32_t type, c.read<uint32_t>("metadata '" + name + "' type"));
    DC_ASSIGN_OR_RETURN(GgufValue v, c.value(type, name, 0));
    if (!g.metadata.emplace(name, std::move(v)).second) return c.error("metadata key '" + name + "' appears twice");
  }
  if (auto it = g.metadata.find("general.alignment"); it != g.metadata.end()) {
    const GgufValue& a = it->second;
    if (a.type != GgufValueType::kU32 || a.i == 0 || (a.i & (a.i - 1)) != 0)
      return parse_error(path + ": metadata 'general.alignment' must be a uint32 power of two, not " +
                         (a.is_integer() ? std::to_string(a.i) : std::string(gguf_value_type_name(a.type))));
    g.alignment = static_cast<uint64_t>(a.i);
  }

  g.tensors.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    DC_ASSIGN_OR_RETURN(std::string_view name, c.string("tensor " + std::to_string(k) + " name"));
    t.name = std::string(name);
    DC_ASSIGN_OR_RETURN(uint32_t n_dims, c.read<uint32_t>("tensor '" + t.name + "' n_dims"));
    if (n_dims == 0 || n_dims > kMaxGgufDims)
      return c.error("tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      DC_ASSIGN_OR_RETURN(uint64_t dim, c.read<uint64_t>("tensor '" + t.name + "' dims"));
      if (dim == 0 || dim > (uint64_t{1} << 40) || n_elements > (uint64_t{1} << 50) / dim)
        return c.error("tensor '" + t.name + "' dimension " + std::to_string(d) + " = " + std::to_string(dim) +
                       " is zero or absurd");
      n_elements *= dim;
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    DC_ASSIGN_OR_RETURN(uint32_t type, c.read<uint32_t>("tensor '" + t.name + "' type"));
    const std::optional<GgufTypeInfo> info = gguf_type_info(type);
    if (!info)
      return unimplemented(path + ": tensor '" + t.name + "' has ggml type " + std::to_string(type) +
                           ", which this engine does not read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, "
                           "Q3_K, Q4_K, Q5_K, Q6_K do; not the IQ* / TQ* types); re-quantize the model to one of those "
                           "(llama-quantize ... Q4_K_M), or convert its source checkpoint with diffucoder convert --out "
                           "FILE.gguf --weights q4_k|q8_0");
    t.type = static_cast<GgufType>(type);
    if (t.dims[0] % info->block != 0)
      return c.error("tensor '" + t.name + "' (" + info->name + ") has " + std::to_string(t.dims[0]) +
                     " columns, not a multiple of its block of " + std::to_string(info->block));
    t.n_bytes = static_cast<size_t>(n_elements / static_cast<uint64_t>(info->block) * static_cast<uint64_t>(info->bytes));
    DC_ASSIGN_OR_RETURN(t.offset, c.read<uint64_t>("tensor '" + t.name + "' offset"));
    if (t.offset % g.alignment != 0)
      return c.error("tensor '" + t.name + "' offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                     std::to_string(g.alignment));
    if (!g.by_name.emplace(t.name, g.tensors.size()).second) return c.error("tensor '" + t.name + "' appears twice");
    g.tensors.push_back(std::move(t));
  }

  const uint64_t data = (c.pos() + g.alignment - 1) / g.alignment * g.alignment;
  if (g.tensors.empty()) {
    g.data_offset = static_cast<size_t>(std::min<uint64_t>(data, size));
    return g;
  }
  if (data > size) return c.error("truncated: the data section starts past the end of the file");
  g.data_offset = static_cast<size_t>(data);
  const uint64_t data_size = size - data;
  std::vector<size_t> order(g.tensors.size());
  for (size_t k = 0; k < order.size(); ++k) {
    GgufTensor& t = g.tensors[k];
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      return parse_error(path + ": tensor '" + t.name + "' (" + std::to_string(t.n_bytes) + " bytes at data offset " +
                         std::to_string(t.offset) + ") runs past the end of the file (" + std::to_string(data_size) +
                         " data bytes); the file is truncated");
    t.data = bytes + data + t.offset;
    order[k] = k;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return g.tensors[a].offset < g.tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensor& a = g.tensors[order[k - 1]];
    const GgufTensor& b = g.tensors[order[k]];
    if (a.offset + a.n_bytes > b.offset)
      return parse_error(path + ": tensors '" + a.name + "' and '" + b.name + "' overlap in the data section");
  }
  return g;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  GgufFile f;
  DC_ASSIGN_OR_RETURN(f.file_, MappedFile::open(path));
  DC_ASSIGN_OR_RETURN(f.parsed_, parse_gguf(f.file_.data(), f.file_.size(), path));
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = parsed_.metadata.find(key);
  return it == parsed_.metadata.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = parsed_.by_name.find(name);
  return it == parsed_.by_name.end() ? nullptr : &parsed_.tensors[it->second];
}

namespace {

Status missing(const std::string& path, std::string_view key) {
  return not_found(path + ": metadata key '" + std::string(key) + "' is missing; was the file converted for " +
                   "architecture dream?");
}

Status wrong_type(const std::string& path, std::string_view key, const GgufValue& v, const char* want) {
  return invalid_argument(path + ": metadata '" + std::string(key) + "' is a " + gguf_value_type_name(v.type) +
                          ", expected " + want);
}

}  // namespace

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing(path(), key);
  if (!v->is_integer()) return wrong_type(path(), key, *v, "an integer");
  return v->i;
}

Result<int64_t> GgufFile::get_int_or(std::string_view key, int64_t fallback) const {
  if (find(key) == nullptr) return fallback;
  return get_int(key);
}

Result<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing(path(), key);
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  return wrong_type(path(), key, *v, "a number");
}

Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing(path(), key);
  if (v->type != GgufValueType::kString) return wrong_type(path(), key, *v, "a string");
  return v->s;
}

}  // namespace dc
