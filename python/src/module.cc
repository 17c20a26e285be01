// diffucoder._core: the Python extension module over the public facade (include/diffucoder/diffucoder.h).
// Arrays in and out are numpy; the Hugging Face surface (torch tensors, padding, defaults) is the Python
// package's (python/diffucoder/). The GIL is released while the engine loads, computes and tokenises
// batches; hooks re-acquire it. Ctrl-C is seen at the next step boundary: the generation is cancelled and
// the KeyboardInterrupt raised. Errors become Python exceptions carrying the engine's message. The library's
// log messages go to logging.getLogger("diffucoder"). Only the public header is used.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <diffucoder/diffucoder.h>

#include <cstdio>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace py = pybind11;
using diffucoder::Generation;
using diffucoder::GenerationConfig;
using diffucoder::LogLevel;
using diffucoder::Model;
using diffucoder::Result;
using diffucoder::Status;
using diffucoder::StatusCode;
using diffucoder::Tokenizer;

namespace {

// The Python exception of a failed Status: ValueError for bad values, FileNotFoundError for missing files,
// MemoryError when memory runs out, OSError for I/O, NotImplementedError, RuntimeError otherwise.
[[noreturn]] void raise_status(const Status& s) {
  PyObject* type = PyExc_RuntimeError;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kParseError: type = PyExc_ValueError; break;
    case StatusCode::kNotFound: type = PyExc_FileNotFoundError; break;
    case StatusCode::kIoError: type = PyExc_OSError; break;
    case StatusCode::kUnimplemented: type = PyExc_NotImplementedError; break;
    case StatusCode::kResourceExhausted: type = PyExc_MemoryError; break;
    default: break;
  }
  PyErr_SetString(type, s.message().c_str());
  throw py::error_already_set();
}

template <typename T>
T value_or_raise(Result<T> r) {
  if (!r.ok()) raise_status(r.status());
  return std::move(r).value();
}

// The library's log messages → logging.getLogger("diffucoder") (warnings: the "note:" lines, errors, info).
// A message logged on a thread that holds the GIL is forwarded at once. The others — logged while the engine
// runs with the GIL released, or on a thread of its own — are queued without touching Python (waiting for the
// GIL there could deadlock against a Python thread that waits for the engine) and forwarded by the next
// flush_log(): after every call that released the GIL, in every hook, and at exit. Where Python cannot take
// them (the interpreter finalizing or gone), they go to stderr as the CLI prints them.
struct LogQueue {
  std::mutex mu;
  std::deque<std::pair<LogLevel, std::string>> items;
};
LogQueue& log_queue() {
  static LogQueue* q = new LogQueue();  // never destroyed: C++ threads may log after the module is gone
  return *q;
}

bool python_is_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

void print_log_line(LogLevel level, std::string_view message) {
  const char* prefix = level == LogLevel::kWarning ? "note: " : level == LogLevel::kError ? "error: " : "";
  std::fprintf(stderr, "%s%.*s\n", prefix, static_cast<int>(message.size()), message.data());
}

// Precondition: the GIL is held and no Python exception is pending.
void forward_to_logging(LogLevel level, std::string_view message) {
  int py_level = 10;  // logging.DEBUG
  if (level == LogLevel::kInfo) py_level = 20;
  else if (level == LogLevel::kWarning) py_level = 30;
  else if (level == LogLevel::kError) py_level = 40;
  try {
    py::object logger = py::module_::import("logging").attr("getLogger")("diffucoder");
    logger.attr("log")(py_level, py::str(message.data(), message.size()));
  } catch (py::error_already_set& e) {  // a failing handler: the message is not lost, the exception not raised here
    e.discard_as_unraisable("diffucoder log message");
    print_log_line(level, message);
  }
}

// Forwards the queued messages, in order. Precondition: the GIL is held.
void flush_log() {
  std::deque<std::pair<LogLevel, std::string>> items;
  {
    std::lock_guard<std::mutex> lock(log_queue().mu);
    items.swap(log_queue().items);
  }
  if (items.empty()) return;
  const bool deliverable = !python_is_finalizing() && PyErr_Occurred() == nullptr;
  for (const auto& [level, message] : items) {
    if (deliverable) forward_to_logging(level, message);
    else print_log_line(level, message);
  }
}

// The sink set_log_callback installs (any thread).
void log_to_python(LogLevel level, std::string_view message) {
  if (Py_IsInitialized() && !python_is_finalizing() && PyGILState_Check() == 1 && PyErr_Occurred() == nullptr) {
    flush_log();  // what came before, first
    forward_to_logging(level, message);
    return;
  }
  if (!Py_IsInitialized() || python_is_finalizing()) {
    print_log_line(level, message);
    return;
  }
  std::lock_guard<std::mutex> lock(log_queue().mu);
  log_queue().items.emplace_back(level, std::string(message));
}

// Deletes a Model with the GIL released (its destructor may wait seconds for the packed-weight cache's
// background write, and other Python threads go on meanwhile), then forwards what it logged.
struct ReleaseGilDelete {
  void operator()(Model* model) const {
    if (PyGILState_Check() != 1 || python_is_finalizing()) {
      delete model;
      return;
    }
    {
      py::gil_scoped_release release;
      delete model;
    }
    flush_log();
  }
};
using ModelHolder = std::unique_ptr<Model, ReleaseGilDelete>;

// A numpy array that owns `v` (moved into a capsule), shaped `shape`.
template <typename T>
py::array_t<T> owning_array(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(shape, heap->data(), owner);
}

// A numpy view of memory the engine owns for the duration of one hook call (the package copies out).
template <typename T>
py::array_t<T> view(T* data, std::vector<py::ssize_t> shape, bool writable) {
  py::array_t<T> a(shape, data, py::none());
  if (!writable) py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

// v as a T; TypeError naming the setting otherwise (bool is refused where a number is wanted), ValueError
// naming it and T's range for an int that T cannot hold.
template <typename T>
T setting(const std::string& key, py::handle v, const char* expected) {
  if (!std::is_same_v<T, bool> && !std::is_same_v<T, std::string> && py::isinstance<py::bool_>(v))
    throw py::type_error(key + ": expected " + expected + ", got a bool");
  try {
    return v.cast<T>();
  } catch (const py::cast_error&) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (py::isinstance<py::int_>(v))
        throw py::value_error(key + ": " + std::string(py::repr(v)) + " is outside [" +
                              std::to_string(std::numeric_limits<T>::min()) + ", " +
                              std::to_string(std::numeric_limits<T>::max()) + "]");
    }
    throw py::type_error(key + ": expected " + expected + ", got " + std::string(py::str(py::type::of(v).attr("__name__"))) +
                         " " + std::string(py::repr(v)));
  }
}

GenerationConfig config_from(const py::dict& d, const Model& model) {
  GenerationConfig c = model.default_config();
  for (auto item : d) {
    const std::string key = py::str(item.first);
    const py::handle v = item.second;
    if (key == "max_new_tokens") c.max_new_tokens = v.is_none() ? std::nullopt : std::optional(setting<int64_t>(key, v, "an int"));
    else if (key == "max_length") c.max_length = v.is_none() ? std::nullopt : std::optional(setting<int64_t>(key, v, "an int"));
    else if (key == "steps") c.steps = setting<int>(key, v, "an int");
    else if (key == "eps") c.eps = setting<float>(key, v, "a float");
    else if (key == "alg") c.alg = setting<std::string>(key, v, "a str");
    else if (key == "alg_temp") c.alg_temp = setting<float>(key, v, "a float");
    else if (key == "temperature") c.temperature = setting<float>(key, v, "a float");
    else if (key == "top_p") c.top_p = setting<float>(key, v, "a float");
    else if (key == "top_k") c.top_k = setting<int64_t>(key, v, "an int");
    else if (key == "num_return_sequences") c.num_return_sequences = setting<int>(key, v, "an int");
    else if (key == "seed") c.seed = setting<uint64_t>(key, v, "a non-negative int");
    else if (key == "output_history") c.output_history = setting<bool>(key, v, "a bool");
    else if (key == "mask_token_id") c.mask_token_id = setting<int32_t>(key, v, "an int");
    else if (key == "pad_token_id") c.pad_token_id = setting<int32_t>(key, v, "an int");
    else if (key == "block_length") c.block_length = setting<int64_t>(key, v, "an int");
    else if (key == "cache") c.cache = setting<std::string>(key, v, "a str");
    else if (key == "refresh_every") c.refresh_every = setting<int>(key, v, "an int");
    else if (key == "threshold") c.threshold = setting<float>(key, v, "a float");
    else if (key == "factor") c.factor = setting<float>(key, v, "a float");
    else if (key == "fast") c.fast = setting<bool>(key, v, "a bool");
    else throw py::type_error("generate() got an unexpected setting '" + key + "'");
  }
  return c;
}

// The hooks of one generate() call: each runs with the GIL, checks for Ctrl-C, and keeps the first
// Python exception (a hook's own, or KeyboardInterrupt) to re-raise once the engine has stopped.
struct PyHooks {
  py::object on_step, on_logits, on_tokens;
  std::exception_ptr error;

  // Runs fn under the GIL unless an error is pending; returns false when one is (then or before).
  template <typename Fn>
  bool call(Fn&& fn) {
    if (error) return false;
    py::gil_scoped_acquire gil;
    flush_log();  // the notes of the steps so far, while the generation runs
    try {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    return !error;
  }

  diffucoder::Hooks make() {
    diffucoder::Hooks h;
    // Always set: it is where Ctrl-C and a failed hook cancel the generation.
    h.on_step = [this](const diffucoder::StepEvent& s) {
      bool keep_going = true;
      const bool ok = call([&] {
        if (on_step.is_none()) return;
        py::object r = on_step(s.step, s.n_steps, view(s.canvas.data(), {s.n_rows, s.n_seq}, false));
        keep_going = r.is_none() || r.cast<bool>();
      });
      return ok && keep_going;
    };
    if (!on_logits.is_none())
      h.on_logits = [this](const diffucoder::LogitsEvent& e) {
        call([&] {
          on_logits(e.step, view(e.canvas.data(), {e.n_rows, e.n_seq}, false),
                    view(e.indices.data(), {static_cast<py::ssize_t>(e.indices.size())}, false),
                    view(e.logits.data(), {static_cast<py::ssize_t>(e.indices.size()), e.n_vocab}, true));
        });
      };
    if (!on_tokens.is_none())
      h.on_tokens = [this](const diffucoder::TokensEvent& e) {
        call([&] { on_tokens(e.step, view(e.canvas.data(), {e.n_rows, e.n_seq}, true)); });
      };
    return h;
  }
};

py::dict generate(const Model& model, const std::vector<std::vector<int32_t>>& prompts, const py::dict& settings,
                  py::object on_step, py::object on_logits, py::object on_tokens) {
  const GenerationConfig config = config_from(settings, model);
  PyHooks hooks{std::move(on_step), std::move(on_logits), std::move(on_tokens), nullptr};
  const diffucoder::Hooks h = hooks.make();
  Result<Generation> r = Status(StatusCode::kInternal, "not run");
  {
    py::gil_scoped_release release;
    r = model.generate(prompts, config, h);
  }
  flush_log();
  if (hooks.error) std::rethrow_exception(hooks.error);
  Generation g = value_or_raise(std::move(r));
  py::dict out;
  const int64_t n_steps = static_cast<int64_t>(g.history.size());
  std::vector<int32_t> history;
  history.reserve(n_steps * g.n_rows * g.n_seq);
  for (const auto& h_step : g.history) history.insert(history.end(), h_step.begin(), h_step.end());
  out["sequences"] = owning_array(std::move(g.sequences), {g.n_rows, g.n_seq});
  out["history"] = config.output_history ? py::object(owning_array(std::move(history), {n_steps, g.n_rows, g.n_seq}))
                                         : py::object(py::none());
  out["prompt_width"] = g.prompt_width;
  out["steps_run"] = g.steps_run;
  out["forwards"] = g.forwards;
  out["total_ms"] = g.total_ms;
  out["forward_ms"] = g.forward_ms;
  out["sampling_ms"] = g.sampling_ms;
  return out;
}

py::array_t<float> forward(const Model& model, py::array_t<int32_t, py::array::c_style | py::array::forcecast> ids,
                           py::object valid, py::object positions) {
  if (ids.ndim() != 2) throw py::value_error("input_ids: must be 2-D [batch, length], got " + std::to_string(ids.ndim()) + "-D");
  const int64_t b = ids.shape(0), l = ids.shape(1);
  diffucoder::ForwardInput in{b, l, {ids.data(), static_cast<size_t>(b * l)}, {}, {}};
  py::array_t<uint8_t, py::array::c_style | py::array::forcecast> valid_a;
  py::array_t<int32_t, py::array::c_style | py::array::forcecast> pos_a;
  if (!valid.is_none()) {
    valid_a = valid;
    if (valid_a.ndim() != 2 || valid_a.shape(0) != b || valid_a.shape(1) != l)
      throw py::value_error("attention_mask: must have the shape of input_ids [" + std::to_string(b) + ", " +
                            std::to_string(l) + "]");
    in.valid = {valid_a.data(), static_cast<size_t>(b * l)};
  }
  if (!positions.is_none()) {
    pos_a = positions;
    if (pos_a.ndim() != 2 || pos_a.shape(0) != b || pos_a.shape(1) != l)
      throw py::value_error("position_ids: must have the shape of input_ids [" + std::to_string(b) + ", " +
                            std::to_string(l) + "]");
    in.positions = {pos_a.data(), static_cast<size_t>(b * l)};
  }
  Result<std::vector<float>> r = Status(StatusCode::kInternal, "not run");
  {
    py::gil_scoped_release release;
    r = model.forward(in);
  }
  flush_log();
  return owning_array(value_or_raise(std::move(r)), {b, l, model.info().n_vocab});
}

std::vector<std::vector<int32_t>> encode_batch(const Tokenizer& tok, const std::vector<std::string>& texts) {
  std::vector<std::vector<int32_t>> out(texts.size());
  Status failed;
  {
    py::gil_scoped_release release;
    for (size_t i = 0; i < texts.size() && failed.ok(); ++i) {
      auto r = tok.encode(texts[i]);
      if (r.ok()) out[i] = std::move(*r);
      else failed = r.status().with_context("text " + std::to_string(i));
    }
  }
  flush_log();
  if (!failed.ok()) raise_status(failed);
  return out;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "diffucoder.cpp engine (the C++ facade); use the diffucoder package, not this module";
  diffucoder::set_log_callback(&log_to_python);
  py::module_::import("atexit").attr("register")(py::cpp_function([] { flush_log(); }));

  py::class_<Tokenizer>(m, "Tokenizer")
      .def(py::init([](const std::string& path) {
             Result<std::unique_ptr<Tokenizer>> r = Status(StatusCode::kInternal, "not run");
             {
               py::gil_scoped_release release;
               r = Tokenizer::load(path);
             }
             flush_log();
             return value_or_raise(std::move(r));
           }),
           py::arg("path"))
      .def("encode", [](const Tokenizer& t, const std::string& text) { return value_or_raise(t.encode(text)); })
      .def("encode_batch", &encode_batch)
      .def("decode", [](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
             return value_or_raise(t.decode(ids, skip));
           }, py::arg("ids"), py::arg("skip_special_tokens") = false)
      .def("token_to_id", &Tokenizer::token_to_id)
      .def("id_to_token", &Tokenizer::id_to_token)
      .def("__len__", &Tokenizer::size);

  py::class_<Model, ModelHolder>(m, "Model")
      .def(py::init([](const std::string& model_dir, const std::string& tokenizer_path, int threads,
                       const std::string& precision, const std::string& weight_cache, const std::string& device,
                       const std::string& lora_dir, const std::string& lora_mode) {
             Result<std::unique_ptr<Model>> r = Status(StatusCode::kInternal, "not run");
             {
               py::gil_scoped_release release;
               diffucoder::LoadOptions options{model_dir, tokenizer_path, threads, precision, weight_cache};
               options.device = device;
               options.lora_dir = lora_dir;
               options.lora_mode = lora_mode;
               r = Model::load(options);
             }
             flush_log();
             return ModelHolder(value_or_raise(std::move(r)).release());
           }),
           py::arg("model_dir"), py::arg("tokenizer_path") = "", py::arg("threads") = 0, py::arg("precision") = "auto",
           py::arg("weight_cache") = "", py::arg("device") = "cpu", py::arg("lora_dir") = "",
           py::arg("lora_mode") = "merged")
      .def_property_readonly("info", [](const Model& model) {
        const diffucoder::ModelInfo& i = model.info();
        py::dict d;
        d["vocab_size"] = i.n_vocab;
        d["hidden_size"] = i.hidden_size;
        d["num_hidden_layers"] = i.n_layer;
        d["num_attention_heads"] = i.n_head;
        d["num_key_value_heads"] = i.n_head_kv;
        d["max_position_embeddings"] = i.max_position_embeddings;
        d["mask_token_id"] = i.mask_token_id;
        d["pad_token_id"] = i.pad_token_id;
        d["eos_token_id"] = i.eos_token_id;
        d["bos_token_id"] = i.bos_token_id;
        d["torch_dtype"] = i.torch_dtype;
        d["precision"] = i.precision;
        return d;
      })
      .def("generate", &generate, py::arg("prompts"), py::arg("settings"), py::arg("on_step") = py::none(),
           py::arg("on_logits") = py::none(), py::arg("on_tokens") = py::none())
      .def("forward", &forward, py::arg("input_ids"), py::arg("attention_mask") = py::none(),
           py::arg("position_ids") = py::none())
      .def("completion_text", [](const Model& model, const std::vector<int32_t>& ids) {
        return value_or_raise(model.completion_text(ids));
      });

  m.def("apply_chat_template", [](const std::vector<std::pair<std::string, std::string>>& messages, bool add_generation_prompt) {
    std::vector<Model::Message> m;
    for (const auto& [role, content] : messages) m.push_back({role, content});
    return value_or_raise(Model::apply_chat_template(m, add_generation_prompt));
  }, py::arg("messages"), py::arg("add_generation_prompt"));
  m.def("instruct_prompt", &Model::instruct_prompt, py::arg("query"));
  // from_pretrained's path: an existing path as is, "ORG/NAME[@REVISION]" its snapshot directory in Hugging
  // Face's local cache (FileNotFoundError naming the paths looked at and the download command otherwise).
  m.def("resolve_model_path", [](const std::string& path) { return value_or_raise(diffucoder::resolve_model_path(path)); },
        py::arg("path"));
}
