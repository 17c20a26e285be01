// The HTTP server: routes (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, / the web
// page), limits, SSE streaming and disconnect handling. Handlers only parse, tokenize, validate and submit;
// the engine thread of the public diffucoder::BatchEngine owns the model's step buffers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <diffucoder/batch.h>

#include "core/status.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/connections.h"
#include "server/openai.h"

namespace dc::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0 = any free port (see HttpServer::port())
  std::string model_name;               // the id of /v1/models and of responses ("" = the model dir's name)
  size_t max_body_bytes = size_t{1} << 20;  // larger bodies get 413
  int http_threads = 128;               // requests answered at once (waiting connections and streams hold none)
  ConnectionLimits connections;         // caps, deadlines, keep-alive, the stream buffer
  ApiKeys api_keys;                     // empty: no key needed
  bool metrics_open = false;            // with keys: /metrics without a key too
  bool web_page = true;                 // serve the page at /
  RequestLimits limits;
  diffucoder::BatchOptions scheduler;   // the BatchEngine's limits and memory budget
};

class HttpServer {
 public:
  // `model` must outlive the server and have a tokenizer. Starts the engine thread (a BatchEngine over `model`
  // with options.scheduler; limits it refuses make bind() fail, naming the field).
  HttpServer(const diffucoder::Model& model, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0: a free one). Errors name the address (or the BatchOptions field refused).
  Status bind();
  int port() const { return port_; }
  // Serves until stop() (from another thread or a signal handler's thread). Precondition: bind() succeeded.
  void run();
  void stop();

  const Metrics& metrics() const { return metrics_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Metrics metrics_;
  int port_ = 0;
};

}  // namespace dc::server
