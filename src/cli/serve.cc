// `diffucoder serve`: the OpenAI-compatible HTTP server over one loaded model (server/http.h). Runs until
// SIGINT / SIGTERM.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <diffucoder/diffucoder.h>

#include "api/status_convert.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/clock.h"
#include "engine/engine.h"
#include "ops/device.h"
#include "server/http.h"

namespace dc::cli {
namespace {

struct ServeArgs {
  std::string model_dir, tokenizer_path, model_name, host = "127.0.0.1", precision = "auto", weight_cache, device = "cpu", lora_mode;
  std::vector<std::string> lora;  // --lora DIR (one) or --lora NAME=DIR (repeatable)
  int port = 8080, threads = 0, http_threads = 128;
  server::RequestLimits limits;
  diffucoder::BatchOptions scheduler;
  size_t max_body_bytes = size_t{1} << 20;
  server::ConnectionLimits connections;
  std::vector<std::string> api_keys;
  std::string api_key_file, max_memory = "auto";
  bool metrics_open = false, no_web_page = false;
};

// Set by SIGINT / SIGTERM; a watcher thread stops the server (stopping takes locks and waits, which a
// signal handler must not do).
volatile std::sig_atomic_t g_stop_requested = 0;

void on_signal(int) { g_stop_requested = 1; }

// --max-memory: a size (bytes, or with K / M / G), or auto: 3/4 of the memory available once the model is
// loaded: on a device (`info` of a model on one) of its device-local heap less the weights, else
// MemAvailable of /proc/meminfo.
Result<int64_t> memory_budget(const std::string& text, const diffucoder::ModelInfo* info = nullptr) {
  if (text == "auto" && info != nullptr && info->device_memory_bytes > 0)
    return std::max<int64_t>(info->device_memory_bytes - info->device_weight_bytes, 0) / 4 * 3;
  if (text == "auto") {
    std::ifstream in("/proc/meminfo");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("MemAvailable:", 0) == 0) return std::stoll(line.substr(13)) * 1024 / 4 * 3;
    return invalid_argument("--max-memory auto: /proc/meminfo has no MemAvailable; give a size (e.g. 8G)");
  }
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const int shift = unit.empty() ? 0 : unit == "K" ? 10 : unit == "M" ? 20 : unit == "G" ? 30 : -1;
  if (used == 0 || value <= 0 || shift < 0 || value > (int64_t{1} << (62 - shift)))
    return invalid_argument("--max-memory " + text + ": expected a positive size such as 1500M or 8G, or auto");
  return value << shift;
}

// --lora and --lora-mode into `lo`: one bare DIR is the server's model (merged unless --lora-mode unmerged);
// NAME=DIR entries are adapters held unmerged over the base, picked by a request's `model`. Errors name the flag.
Status apply_lora_flags(const ServeArgs& a, diffucoder::LoadOptions* lo) {
  std::optional<LoraMode> mode;
  if (!a.lora_mode.empty()) {
    DC_ASSIGN_OR_RETURN(mode, parse_lora_mode(a.lora_mode));
  }
  std::vector<std::string> bare;
  for (const std::string& entry : a.lora) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || entry.substr(0, eq).find('/') != std::string::npos) {  // a path
      bare.push_back(entry);
      continue;
    }
    diffucoder::LoadOptions::NamedAdapter n{entry.substr(0, eq), entry.substr(eq + 1)};
    if (n.name.empty() || n.dir.empty())
      return invalid_argument("--lora " + entry + ": expected NAME=DIR (an adapter's name for requests' model "
                              "field and its directory) or a directory");
    lo->lora_adapters.push_back(std::move(n));
  }
  if (!bare.empty() && (bare.size() > 1 || !lo->lora_adapters.empty()))
    return invalid_argument("--lora: a bare directory (" + bare[0] + ") is the server's one adapter; to serve several, "
                            "name each: --lora NAME=DIR");
  if (!lo->lora_adapters.empty() && mode == LoraMode::kMerged)
    return invalid_argument("--lora-mode merged: named adapters (--lora NAME=DIR) are held unmerged over the base, "
                            "so that a request picks one; merge one adapter with a bare --lora DIR");
  if (!bare.empty()) lo->lora_dir = bare[0], lo->lora_mode = mode == LoraMode::kUnmerged ? "unmerged" : "merged";
  return Status::ok_status();
}

// Flag combinations that cannot work, checked before the model is loaded (exit code 2).
Status check_usage(const ServeArgs& a) {
  if (a.limits.default_max_tokens > a.limits.max_tokens)
    return invalid_argument("--default-max-tokens " + std::to_string(a.limits.default_max_tokens) +
                            " is more than --max-tokens " + std::to_string(a.limits.max_tokens) +
                            ": a request without max_tokens would exceed the limit; lower it");
  if (a.max_memory != "auto") DC_RETURN_IF_ERROR(memory_budget(a.max_memory).status());
  DC_RETURN_IF_ERROR(parse_device(a.device).status());
  diffucoder::LoadOptions lo;
  DC_RETURN_IF_ERROR(apply_lora_flags(a, &lo));
  return parse_matmul_precision(a.precision).status();
}

int run_serve(const ServeArgs& a) {
  if (Status st = check_usage(a); !st.ok()) return usage_error(st);
  Result<server::ApiKeys> keys = server::ApiKeys::load(a.api_keys, a.api_key_file);
  if (!keys.ok()) return usage_error(keys.status());
  diffucoder::LoadOptions lo;  // (precision, device and --lora checked by check_usage)
  lo.model_dir = a.model_dir;
  lo.tokenizer_path = a.tokenizer_path;
  lo.threads = a.threads;
  lo.precision = a.precision;
  lo.weight_cache = a.weight_cache;
  lo.device = a.device;
  if (Status st = apply_lora_flags(a, &lo); !st.ok()) return usage_error(st);
  const auto t_load = std::chrono::steady_clock::now();
  diffucoder::Result<std::unique_ptr<diffucoder::Model>> loaded = diffucoder::Model::load(lo);
  if (!loaded.ok()) return report(api::to_internal(loaded.status()));
  const diffucoder::Model& model = **loaded;
  print_load_note(model.info().load_note, ms_since(t_load));
  if (model.tokenizer() == nullptr)
    return report(not_found("serve: the model directory has no tokenizer.json; pass --tokenizer FILE"));
  {  // one row of --max-tokens must fit the sampler's logits limit, or every such request would fail
    diffucoder::GenerationConfig c = model.default_config();
    c.max_new_tokens = a.limits.max_tokens;
    if (diffucoder::Status st = model.check_generation_size({{0}}, c); !st.ok())
      return usage_error(invalid_argument("--max-tokens " + std::to_string(a.limits.max_tokens) +
                                          " is too large for this model: " + st.message()));
  }
  Result<int64_t> budget = memory_budget(a.max_memory, &model.info());
  if (!budget.ok()) return usage_error(budget.status());
  if (*budget == 0)  // auto on a device the weights fill
    return report(resource_exhausted("serve: the weights leave no memory on " + model.info().device +
                                     " for the KV caches and step buffers; give --max-memory SIZE or use a smaller model"));
  if (const int64_t head = model.head_block_bytes(); *budget > 0 && *budget < head)
    return usage_error(invalid_argument("--max-memory " + a.max_memory + " is below the " + std::to_string(head >> 20) +
                                        " MiB block of logits one step needs for this model's vocabulary"));
  server::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  // The directory's own name, also for "." or "dir/" (the absolute, normalised path's last component).
  std::filesystem::path dir = std::filesystem::absolute(a.model_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  // A model of the Hugging Face cache (--model ORG/NAME, resolved to models--ORG--NAME/snapshots/<commit>) is
  // named ORG/NAME, as clients ask for it, not by its commit.
  std::string name = dir.filename().string();
  const std::string repo = dir.parent_path().parent_path().filename().string();
  if (dir.parent_path().filename() == "snapshots" && repo.rfind("models--", 0) == 0 && repo.size() > 8) {
    name = repo.substr(8);
    if (const size_t sep = name.find("--"); sep != std::string::npos) name.replace(sep, 2, "/");
  }
  so.model_name = a.model_name.empty() ? name : a.model_name;
  so.max_body_bytes = a.max_body_bytes;
  so.http_threads = a.http_threads;
  so.limits = a.limits;
  so.scheduler = a.scheduler;
  so.scheduler.max_memory_bytes = *budget;
  so.connections = a.connections;
  so.api_keys = *keys;
  so.metrics_open = a.metrics_open;
  so.web_page = !a.no_web_page;
  server::HttpServer srv(model, so);
  if (Status st = srv.bind(); !st.ok()) return report(st);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::atomic<bool> running{true};
  std::thread watcher([&] {
    while (running.load() && g_stop_requested == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_stop_requested != 0) srv.stop();
  });
  std::fprintf(stderr, "serve: %s on http://%s:%d (max batch %d rows, queue %d, memory budget %lld MiB%s, %s)\n",
               so.model_name.c_str(), a.host.c_str(), srv.port(), a.scheduler.max_batch_rows, a.scheduler.max_queue,
               static_cast<long long>(*budget >> 20), model.info().device_memory_bytes > 0 ? " of device memory" : "",
               so.api_keys.empty() ? "no API key: anyone who can reach the port can use it"
                                   : (std::to_string(so.api_keys.size()) + " API key(s) accepted").c_str());
  std::fflush(stderr);
  srv.run();
  running = false;
  watcher.join();
  std::fprintf(stderr, "serve: stopped\n");
  return 0;
}

}  // namespace

RunFn add_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model", a->model_dir, "Hugging Face checkpoint directory, or a dream FILE.gguf")->required();
  cmd->add_option("--tokenizer", a->tokenizer_path, "tokenizer.json (default: the model's)");
  cmd->add_option("--model-name", a->model_name, "The model id clients see (default: the directory's name)");
  cmd->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "Port (0 = any free port, printed on stderr)")->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--threads", a->threads, "CPU threads of the engine (0 = all)")->capture_default_str()
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_option("--precision", a->precision, "Matmul activations: auto (bf16 for bf16 checkpoints) | f32 | bf16")
      ->capture_default_str();
  cmd->add_option("--weight-cache", a->weight_cache,
                  "Where to keep the packed weights between starts: a directory, or off (default: beside the model)");
  cmd->add_option("--device", a->device,
                  "Where the forward runs: cpu | vulkan | vulkan:N (every cache mode but committed; the requests "
                  "without a KV cache share one forward per step, each with a cache runs its own)")
      ->capture_default_str();
  cmd->add_option("--lora", a->lora,
                  "A PEFT LoRA adapter directory applied to the model (docs/lora.md); or NAME=DIR, repeatable: adapters "
                  "held unmerged over the base, a request's model field picks one by NAME (the base's name: none)");
  cmd->add_option("--lora-mode", a->lora_mode,
                  "merged | unmerged: how a bare --lora DIR is applied (default merged); NAME=DIR adapters are unmerged");
  cmd->add_flag("--fast", a->limits.fast,
                "Requests without block_length / cache / threshold / factor decode in the Fast-dLLM mode "
                "(blocks of 32, dual cache, threshold 0.9; approximate)");
  cmd->add_option("--http-threads", a->http_threads,
                  "Requests parsed or answered at once (waiting connections and streams hold none)")->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-connections", a->connections.max_connections, "Open connections in total; more get 503")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-connections-per-client", a->connections.max_per_client,
                  "Open connections from one client address; more get 503")->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--request-timeout", a->connections.request_timeout_s,
                  "Seconds for a request's head and body to arrive, from its first byte; then the connection closes")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  cmd->add_option("--keep-alive-timeout", a->connections.keep_alive_timeout_s,
                  "Seconds an idle kept-alive connection stays open")->capture_default_str()->check(CLI::Range(1, 3600));
  cmd->add_option("--io-timeout", a->connections.io_timeout_s,
                  "Seconds a client may take no byte of its response (a stream's reader included); then it is dropped")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  cmd->add_option("--max-stream-buffer", a->connections.max_stream_buffer_bytes,
                  "Bytes of earlier steps' events a stream's reader may leave unsent (past the socket's buffers); "
                  "then it is dropped and its job cancelled")->capture_default_str()->check(CLI::Range(size_t{4096}, size_t{1} << 34));
  cmd->add_option("--max-memory", a->max_memory,
                  "Budget for the batch's step buffers (logits), e.g. 8G; with --device the device memory of the "
                  "requests (KV caches, activations, logits rows); requests wait for room, and one that can never fit "
                  "gets 503 (auto: 3/4 of the memory available after loading: the device's heap less the weights "
                  "with --device)")->capture_default_str();
  cmd->add_option("--api-key", a->api_keys,
                  "Require Authorization: Bearer KEY on /v1/* and /metrics (repeat for several keys)");
  cmd->add_option("--api-key-file", a->api_key_file, "Keys, one per line ('#' comments), as --api-key");
  cmd->add_flag("--metrics-open", a->metrics_open, "With keys: /metrics answers without a key (for a scraper)");
  cmd->add_flag("--no-web-page", a->no_web_page, "Do not serve the page at /");
  cmd->add_option("--max-batch", a->scheduler.max_batch_rows, "Canvas rows decoded together (1 = one at a time)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--max-batch-positions", a->scheduler.max_batch_positions, "Rows x canvas length of a batch")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--max-queue", a->scheduler.max_queue, "Requests waiting; more get 503")->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--max-queue-seconds", a->scheduler.max_queue_seconds, "Queue time limit; then 503")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--max-body-bytes", a->max_body_bytes, "Request body limit; larger get 413")->capture_default_str();
  cmd->add_option("--max-tokens", a->limits.max_tokens, "Largest max_tokens / steps a request may ask")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--default-max-tokens", a->limits.default_max_tokens, "max_tokens when a request has none")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-prompt-tokens", a->limits.max_prompt_tokens, "Longest prompt (tokens)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--max-n", a->limits.max_n, "Largest n per request")->capture_default_str()->check(CLI::Range(1, 1024));
  require_finite_floats(cmd);
  return [a] { return run_serve(*a); };
}

}  // namespace dc::cli
