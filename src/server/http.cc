// HttpServer: cpp-httplib routes around the public BatchEngine (include/diffucoder/batch.h). Completions are
// tokenized and checked here, submitted as BatchRequests, and answered as one JSON object or as server-sent
// events (text final from the left, optional canvas events; written by the ConnectionHub, not a worker); a
// client that goes away cancels its job so its rows leave the batch.
#include "server/http.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "server/canvas.h"
#include "server/web_ui.h"

namespace dc::server {

using diffucoder::BatchJob;
using diffucoder::BatchResult;
using diffucoder::BatchStep;
using diffucoder::SubmitCode;

namespace {

using nlohmann::json;
using namespace std::chrono_literals;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%016llx%06llx", prefix, static_cast<unsigned long long>(salt),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return buf;
}

// The connection of the request a worker serves and its stream (set by Impl::serve_connection), and whether
// its response asked to close it (set by the logger, which sees the response).
thread_local int t_connection_fd = -1;
thread_local DeadlineStream* t_stream = nullptr;
thread_local bool t_close_after = false;

// Writes all of `data` to `fd` directly (waiting up to 5 s per write); false when the peer is gone.
bool send_raw(int fd, const std::string& data) {
  for (size_t at = 0; at < data.size();) {
    pollfd w{fd, POLLOUT, 0};
    if (poll(&w, 1, 5000) <= 0) return false;
    const ssize_t n = send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0 && errno != EAGAIN) return false;
    if (n > 0) at += static_cast<size_t>(n);
  }
  return true;
}

// A whole response with a body, for writing on the socket ourselves.
std::string raw_response(int status, const std::string& content_type, const std::string& body, bool close) {
  const char* reason = status == 200 ? "OK" : status == 400 ? "Bad Request" : status == 404 ? "Not Found"
                     : status == 500 ? "Internal Server Error" : status == 503 ? "Service Unavailable" : "Error";
  return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + (close ? "\r\nConnection: close" : "") + "\r\n\r\n" +
         body;
}

// Whether the client of a waiting request went away; a request it pipelined counts as alive.
// A client that only shut down its sending side (shutdown(SHUT_WR), `nc -N`) still reads the answer, and
// end-of-file alone cannot tell it from one that closed: on the first end-of-file a 1xx interim response
// probes the connection, which a closed peer answers with a reset.
class PeerWatch {
 public:
  explicit PeerWatch(int fd) : fd_(fd) {}
  bool gone() {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP)) return true;
    if (half_closed_) return false;
    char c;
    const bool eof = (p.revents & POLLRDHUP) != 0 || recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    if (!eof) return false;
    static const char kProbe[] = "HTTP/1.1 102 Processing\r\n\r\n";
    if (send(fd_, kProbe, sizeof(kProbe) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) return true;
    pollfd q{fd_, POLLIN | POLLRDHUP, 0};
    if (poll(&q, 1, 200) > 0 && (q.revents & (POLLERR | POLLHUP))) return true;
    half_closed_ = true;  // still reading: answer it
    return false;
  }

  // httplib 0.11 writes nothing to a socket whose peer sent end-of-file (its liveness check reads EOF as
  // gone). A client that only shut down its sending side still reads: send it `res` here, whole, with
  // Connection: close (httplib's own write then fails quietly). No-op for a client that is still sending.
  void answer_if_half_closed(const httplib::Response& res) const {
    if (half_closed()) send_raw(fd_, raw_response(res.status, res.get_header_value("Content-Type"), res.body, true));
  }

  // True when the peer sent end-of-file but can still read (no reset or hang-up seen).
  bool half_closed() const {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0 || (p.revents & (POLLERR | POLLHUP))) return false;
    char c;
    return (p.revents & POLLRDHUP) != 0 || recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }

 private:
  int fd_;
  bool half_closed_ = false;
};

// httplib 0.11 takes the first of several Content-Length headers and reads "-1" as 2^64 - 1 (then waits for
// that body). A request must frame its body unambiguously: one decimal Content-Length (repeats must agree),
// not together with Transfer-Encoding. Returns the error for a request that does not, with the status.
std::optional<std::pair<int, std::string>> bad_framing(const httplib::Request& req, size_t max_body_bytes) {
  std::string length;
  for (auto [it, end] = req.headers.equal_range("Content-Length"); it != end; ++it) {
    const std::string& v = it->second;
    if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
      return std::make_pair(400, "Content-Length: must be a decimal byte count, got '" + v.substr(0, 40) + "'");
    if (!length.empty() && v != length)
      return std::make_pair(400, "Content-Length: two different values (" + length + ", " + v + ")");
    length = v;
  }
  if (!length.empty() && req.has_header("Transfer-Encoding"))
    return std::make_pair(400, std::string("Content-Length: not allowed together with Transfer-Encoding"));
  if (!length.empty() && std::stoull(length) > max_body_bytes)
    return std::make_pair(413, std::string("body: larger than the server's limit (--max-body-bytes)"));
  return std::nullopt;
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.http_status, e.to_json()); }

ApiError overloaded(const std::string& message) {
  ApiError e;
  e.http_status = 503;
  e.type = "server_error";
  e.code = "server_overloaded";
  e.message = message;
  return e;
}

// The error of a job that failed: 503 when it could not run now (queue time, memory), 500 when the model
// or the sampler failed, else as its status says (4xx).
ApiError job_error(const BatchResult& r) {
  if (r.queue_timeout || r.unavailable) return overloaded(r.status.message());
  if (r.model_error) {
    ApiError e;
    e.http_status = 500;
    e.type = "server_error";
    e.code = "model_error";
    e.message = r.status.message();
    return e;
  }
  return api_error(from_public(r.status));
}

// httplib's server with the connection handling replaced: httplib accepts, the ConnectionHub holds each
// connection until a request is complete, and a worker parses and answers that one request (serve_one).
class Listener : public httplib::Server {
 public:
  // httplib listens with a backlog of 5, too few for many clients connecting at once (the kernel then drops
  // connections); Linux lets a second listen() on the bound socket raise it.
  void raise_backlog(int n) { ::listen(svr_sock_, n); }
  // One request on `strm`; false when the connection must close (error, or the client asked).
  bool serve_one(httplib::Stream& strm) {
    bool closed = false;
    const bool ok = process_request(strm, false, closed, nullptr);
    return ok && !closed;
  }
  std::function<void(int)> on_accept;

 private:
  bool process_and_close_socket(socket_t sock) override {
    on_accept(sock);
    return true;
  }
};

// httplib queues a task per accepted socket; ours only hands it to the hub, so it runs at once on the
// accepting thread (no worker needed to accept).
class InlineQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

// One streamed response: what was sent so far. Used by the hub's thread only (StreamBody).
struct StreamState {
  ApiRequest request;
  std::shared_ptr<BatchJob> job;
  ResponseMeta meta;
  int64_t prompt_tokens = 0;
  std::vector<std::string> sent;      // text sent per choice
  std::vector<std::string> finished;  // finish_reason per choice ("" = running)
  std::vector<int64_t> tokens;        // completion tokens per choice
  bool keep = false;                  // the connection stays open after the response
  bool head_sent = false, started = false, done = false;
  std::optional<CanvasView> canvas;   // stream_canvas: the rows as last sent (each step decodes what changed)
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
};

// A stream the handler queued: serve_connection hands it to the hub once httplib is done with the request.
thread_local std::shared_ptr<StreamState> t_handoff;

// The text of a row's final prefix (unmasked from the left), cut at stop ids; `stopped` when a stop id is in it.
struct RowText {
  std::string text;
  int64_t tokens = 0;
  bool stopped = false;
};

}  // namespace

struct HttpServer::Impl {
  const diffucoder::Model& model;      // the BatchEngine's; parse_request's defaults, the prompt checks, the tokenizer
  ServerOptions options;
  Metrics& metrics;
  Listener http;
  std::unique_ptr<diffucoder::BatchEngine> batch;  // null when create() refused the options (bind() says why)
  Status batch_status;                // why, with batch null
  std::vector<int32_t> stop_ids;
  int32_t mask_id = 0;
  const int64_t started = unix_now();  // `created` of /v1/models
  std::atomic<int> open_streams{0};    // SSE responses not yet ended (stop() lets them finish)
  httplib::ThreadPool workers;         // serve complete requests (serve_connection)
  std::unique_ptr<ConnectionHub> hub;
  std::once_flag stopped;

  Impl(const diffucoder::Model& m, ServerOptions o, Metrics& me)
      : model(m), options(std::move(o)), metrics(me),
        workers(static_cast<size_t>(options.http_threads)) {
    hub = std::make_unique<ConnectionHub>(
        options.connections, [this](std::function<void()> fn) { workers.enqueue(std::move(fn)); },
        [this](int fd, SteadyTime deadline, size_t head_bytes) { serve_connection(fd, deadline, head_bytes); },
        &metrics);
    http.on_accept = [this](int fd) { hub->accept(fd); };
  }

  // On a worker: one complete request of connection `fd`, then the connection goes back to the hub: to wait
  // for its next request, or to be written its stream.
  void serve_connection(int fd, SteadyTime deadline, size_t head_bytes) {
    t_connection_fd = fd;
    t_close_after = false;
    DeadlineStream strm(fd, deadline, options.connections.io_timeout_s, head_bytes);
    t_stream = &strm;
    const bool keep = http.serve_one(strm) && !t_close_after && http.is_running();
    t_connection_fd = -1;
    t_stream = nullptr;
    if (t_handoff == nullptr) return hub->release(fd, keep);
    std::shared_ptr<StreamState> st = std::move(t_handoff);
    t_handoff = nullptr;
    StreamBody body{[this, st](bool* done) { return stream_some(*st, done); },
                    [this, st](bool) {
                      if (!st->done) {  // the client went away mid-stream (or read too slowly): free the rows
                        st->job->cancel();
                        metrics.on_disconnect();
                      }
                      --open_streams;
                    }};
    st->job->set_listener(hub->stream(fd, std::move(body), st->keep && http.is_running()));
  }

  RowText row_text(const std::vector<int32_t>& generated) const {
    RowText r;
    std::vector<int32_t> ids;
    for (int32_t t : generated) {
      if (t == mask_id) break;
      if (std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end()) {
        r.stopped = true;
        break;
      }
      ids.push_back(t);
    }
    r.tokens = static_cast<int64_t>(ids.size());
    diffucoder::Result<std::string> text = model.completion_text(ids);
    if (text.ok()) r.text = std::move(*text);
    return r;
  }

  // The adapter a request's `model` picks (serve --lora NAME=DIR): an adapter's name picks it; the base's
  // name or none picks no adapter. Any other name: a 404 naming the models (with adapters only: a server
  // of one model answers to any name, as OpenAI clients' defaults send one).
  std::optional<ApiError> pick_adapter(const std::string& name, std::string* adapter) const {
    adapter->clear();
    const std::vector<std::string> names = model.adapter_names();
    if (names.empty() || name.empty() || name == options.model_name) return std::nullopt;
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      *adapter = name;
      return std::nullopt;
    }
    std::string listed = "'" + options.model_name + "' (the base model)";
    for (const std::string& n : names) listed += ", '" + n + "'";
    ApiError e;
    e.http_status = 404;
    e.param = "model";
    e.code = "model_not_found";
    e.message = "model: '" + name + "' is not a model of this server; it serves " + listed + " (GET /v1/models)";
    return e;
  }

  Result<std::vector<int32_t>> prompt_ids(const ApiRequest& r) const {
    std::vector<int32_t> ids;
    if (r.endpoint == Endpoint::kChatCompletions) {
      diffucoder::Result<std::string> text = diffucoder::Model::apply_chat_template(r.messages, true);
      if (!text.ok()) return from_public(text.status());
      diffucoder::Result<std::vector<int32_t>> enc = model.encode_prompt(*text, false);
      if (!enc.ok()) return invalid_argument("messages: " + enc.status().message());
      ids = std::move(*enc);
    } else if (r.has_prompt_ids) {
      ids = r.prompt_ids;
      DC_RETURN_IF_ERROR(from_public(model.check_token_ids(ids, "prompt")));
    } else {
      diffucoder::Result<std::vector<int32_t>> enc = model.encode_prompt(r.prompt, false);
      if (!enc.ok()) return invalid_argument("prompt: " + enc.status().message());
      ids = std::move(*enc);
    }
    const std::string field = r.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
    if (ids.empty()) return invalid_argument(field + ": the prompt is empty (no tokens)");
    const int64_t n = static_cast<int64_t>(ids.size());
    if (n > options.limits.max_prompt_tokens)
      return invalid_argument(field + ": the prompt has " + std::to_string(n) + " tokens, more than the limit of " +
                              std::to_string(options.limits.max_prompt_tokens));
    const diffucoder::Result<int64_t> length = model.canvas_length(n, r.config);
    if (!length.ok()) return from_public(length.status()).with_context("max_tokens");
    if (diffucoder::Status st = model.check_generation_size({ids}, r.config); !st.ok())
      return invalid_argument((r.n > 1 ? "n: " : "max_tokens: ") + st.message());
    const int64_t kv_bytes = model.kv_cache_bytes(r.config.num_return_sequences, *length);
    if (r.config.cache != "none" && kv_bytes > model.max_kv_cache_bytes())
      return invalid_argument("cache: n × (prompt + max_tokens) needs a KV cache of " + std::to_string(kv_bytes >> 20) +
                              " MiB, more than the server's limit of " +
                              std::to_string(model.max_kv_cache_bytes() >> 20) + " MiB; use cache none");
    return ids;
  }

  void completions(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    Result<ApiRequest> parsed = parse_request(endpoint, req.body, model.default_config(), options.limits);
    if (!parsed.ok()) return send_error(res, api_error(parsed.status()));
    ApiRequest r = std::move(*parsed);
    diffucoder::BatchRequest request;
    if (std::optional<ApiError> bad = pick_adapter(r.model, &request.adapter)) return send_error(res, *bad);
    Result<std::vector<int32_t>> ids = prompt_ids(r);
    if (!ids.ok()) return send_error(res, api_error(ids.status()));
    const int64_t prompt_tokens = static_cast<int64_t>(ids->size());
    request.prompt = std::move(*ids);
    request.config = r.config;
    request.stop_ids = stop_ids;
    request.publish_steps = r.stream;
    diffucoder::Submission submitted = batch->submit(request);
    const std::shared_ptr<BatchJob> job = submitted.job;
    switch (submitted.code) {
      case SubmitCode::kOk: break;
      case SubmitCode::kInvalid:  // what prompt_ids() checked, the facade checks again: no request gets here
        return send_error(res, api_error(from_public(submitted.status)));
      case SubmitCode::kQueueFull:
        metrics.on_rejected();
        return send_error(res, overloaded("the request queue is full; retry later"));
      case SubmitCode::kStopped: return send_error(res, overloaded("the server is shutting down"));
      case SubmitCode::kOverMemory: {
        metrics.on_rejected();
        const int64_t need = batch->memory_needed(request).value();  // submit checked the request
        const diffucoder::ModelInfo& info = model.info();
        const std::string what =
            info.device_memory_bytes > 0
                ? " MiB of memory on " + info.device + " (its KV cache if it has one, activations and logits rows)"
                : " MiB of step buffers (a hidden row per masked position)";
        ApiError e = overloaded("n × max_tokens needs about " + std::to_string(need >> 20) + what +
                                ", more than the server's memory budget of " +
                                std::to_string(options.scheduler.max_memory_bytes >> 20) +
                                " MiB (--max-memory); ask for fewer tokens or rows, or decode in blocks (block_length)");
        e.param = r.n > 1 ? "n" : "max_tokens";
        return send_error(res, e);
      }
      case SubmitCode::kTooLarge: {
        ApiError e;
        e.param = r.n > 1 ? "n" : "max_tokens";
        e.message = "n × (prompt + max_tokens) exceeds the server's batch limits (--max-batch " +
                    std::to_string(options.scheduler.max_batch_rows) + " rows, " +
                    std::to_string(options.scheduler.max_batch_positions) + " positions)";
        return send_error(res, e);
      }
    }
    const ResponseMeta meta{random_id(endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-"), unix_now(),
                            r.model.empty() ? options.model_name : r.model};
    if (r.stream) return stream(req, res, std::move(r), job, meta, prompt_tokens);
    PeerWatch peer(t_connection_fd);
    // Wait in the queue (watching the client), so that a queue timeout is still a 503.
    while (!job->wait_admitted(100ms)) {
      if (peer.gone()) {
        job->cancel();
        metrics.on_disconnect();
        res.status = 499;  // nobody reads it
        return;
      }
    }
    BatchResult early;
    if (job->wait(0ms, nullptr, &early) && !early.status.ok()) {
      if (early.queue_timeout || early.unavailable) metrics.on_rejected();
      return send_error(res, job_error(early));
    }

    BatchResult result;
    while (!job->wait(200ms, nullptr, &result)) {
      if (peer.gone()) {
        job->cancel();
        metrics.on_disconnect();
        res.status = 499;
        return;
      }
    }
    if (!result.status.ok()) {
      send_error(res, job_error(result));
      return peer.answer_if_half_closed(res);
    }
    std::vector<Choice> choices;
    for (const auto& gen : result.generated) {
      RowText t = row_text(gen);
      Choice c;
      c.completion_tokens = t.tokens;
      c.finish_reason = t.stopped ? "stop" : "length";
      const size_t at = find_stop(t.text, r.stop);
      if (at != std::string::npos) {
        t.text.resize(at);
        c.finish_reason = "stop";
      }
      c.text = std::move(t.text);
      choices.push_back(std::move(c));
    }
    const json ext = {{"steps", result.steps_run},
                      {"forwards", result.forwards},
                      {"queue_ms", result.queue_ms},
                      {"run_ms", result.run_ms},
                      {"stopped_early", result.stopped_early}};
    send_json(res, 200, response_json(endpoint, meta, choices, prompt_tokens, ext));
    peer.answer_if_half_closed(res);
  }

  static std::shared_ptr<StreamState> stream_state(ApiRequest r, std::shared_ptr<BatchJob> job, ResponseMeta meta,
                                                   int64_t prompt_tokens) {
    auto st = std::make_shared<StreamState>();
    const size_t n = static_cast<size_t>(r.n);
    st->request = std::move(r);
    st->job = std::move(job);
    st->meta = std::move(meta);
    st->prompt_tokens = prompt_tokens;
    st->sent.assign(n, "");
    st->finished.assign(n, "");
    st->tokens.assign(n, 0);
    return st;
  }

  // A queued stream: the hub answers it (serve_connection), from its wait in the queue on, and httplib's own
  // response is not sent. A client that shut down its sending side still reads its stream; its connection
  // closes after it.
  void stream(const httplib::Request& req, httplib::Response& res, ApiRequest r, std::shared_ptr<BatchJob> job,
              ResponseMeta meta, int64_t prompt_tokens) {
    t_handoff = stream_state(std::move(r), std::move(job), std::move(meta), prompt_tokens);
    t_handoff->keep = !PeerWatch(t_connection_fd).half_closed() && req.version == "HTTP/1.1" &&
                      req.get_header_value("Connection") != "close";
    ++open_streams;
    t_stream->discard_writes();
    res.status = 200;  // (the logger does not count it: stream_some counts the response it sends)
  }

  // On the hub's thread: the bytes that are new (never waits; none while the job is queued): the response
  // head once the job is admitted (or an error response, as without streaming, when it failed before its
  // first step), then its events as chunks; *done after `data: [DONE]`.
  std::string stream_some(StreamState& st, bool* done) {
    const ApiRequest& r = st.request;
    *done = false;
    if (!st.head_sent && !st.job->wait_admitted(0ms)) return "";
    std::vector<BatchStep> snaps;
    BatchResult result;
    const bool finished = st.job->wait(0ms, &snaps, &result);
    std::string wire;
    if (!st.head_sent) {
      st.head_sent = true;
      if (finished && !result.status.ok()) {
        if (result.queue_timeout || result.unavailable) metrics.on_rejected();
        const ApiError e = job_error(result);
        metrics.on_response(e.http_status);
        st.done = *done = true;
        return raw_response(e.http_status, "application/json",
                            e.to_json().dump(-1, ' ', false, json::error_handler_t::replace), !st.keep);
      }
      metrics.on_response(200);
      wire = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             "X-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n" +
             std::string(st.keep ? "" : "Connection: close\r\n") + "\r\n";
    }
    std::string out;
    if (!st.started) {
      st.started = true;
      if (r.endpoint == Endpoint::kChatCompletions)
        for (int i = 0; i < r.n; ++i) out += sse_event(chunk_json(r.endpoint, st.meta, i, "", true, ""));
    }
    if (r.stream_canvas) {
      if (!st.canvas) st.canvas.emplace(*model.tokenizer(), mask_id);
      for (const BatchStep& s : snaps) {
        st.canvas->update(s.rows);
        json event = {{"step", s.step}, {"n_steps", s.n_steps}};
        if (r.canvas_changes && !st.canvas->reshaped()) {
          event["changes"] = st.canvas->changes();
        } else {
          event["rows"] = st.canvas->rows();
        }
        out += sse_event(event, "canvas");
      }
    }
    auto advance = [&](size_t i, const std::vector<int32_t>& gen, bool final) {
      if (!st.finished[i].empty()) return;
      RowText t = row_text(gen);
      st.tokens[i] = t.tokens;
      std::string reason = t.stopped ? "stop" : final ? "length" : "";
      size_t cut = find_stop(t.text, r.stop);
      if (cut != std::string::npos) {
        reason = "stop";
      } else {
        cut = reason.empty() ? streamable_prefix(t.text, r.stop) : t.text.size();
      }
      if (cut > st.sent[i].size() && t.text.compare(0, st.sent[i].size(), st.sent[i]) == 0) {
        const std::string delta = t.text.substr(st.sent[i].size(), cut - st.sent[i].size());
        out += sse_event(chunk_json(r.endpoint, st.meta, static_cast<int>(i), delta, false, ""));
        st.sent[i] = t.text.substr(0, cut);
      }
      if (!reason.empty()) {
        st.finished[i] = reason;
        out += sse_event(chunk_json(r.endpoint, st.meta, static_cast<int>(i), "", false, reason));
      }
    };
    if (!snaps.empty()) {
      const BatchStep& last = snaps.back();
      for (size_t i = 0; i < last.rows.size() && i < st.finished.size(); ++i) advance(i, last.rows[i], false);
    }
    bool all_finished = std::all_of(st.finished.begin(), st.finished.end(), [](const std::string& s) { return !s.empty(); });
    if (finished) {
      if (!result.status.ok() && !all_finished) {
        out += sse_event(job_error(result).to_json());
      } else {
        for (size_t i = 0; i < result.generated.size() && i < st.finished.size(); ++i)
          advance(i, result.generated[i], true);
      }
      all_finished = true;
    }
    if (all_finished) {
      st.job->cancel();  // stop strings may end every choice before the job does: free the rows
      if (r.include_usage) {
        int64_t total = 0;
        for (int64_t t : st.tokens) total += t;
        out += sse_event(usage_chunk_json(r.endpoint, st.meta, st.prompt_tokens, total));
      }
      out += "data: [DONE]\n\n";
      st.done = true;
    }
    const auto now = std::chrono::steady_clock::now();
    if (out.empty() && now - st.last_write > 1s) out = ": keep-alive\n\n";  // finds a client that went away
    if (!out.empty()) {
      st.last_write = now;
      char size[24];
      std::snprintf(size, sizeof(size), "%zx\r\n", out.size());
      wire.append(size).append(out).append("\r\n");
    }
    if (st.done) wire += "0\r\n\r\n";
    *done = st.done;
    return wire;
  }

  void routes() {
    http.set_payload_max_length(options.max_body_bytes);
    http.set_keep_alive_max_count(1 << 20);  // clients (and the OpenAI libraries) reuse connections
    http.set_keep_alive_timeout(options.connections.keep_alive_timeout_s);  // (the hub closes idle ones)
    http.new_task_queue = [] { return new InlineQueue; };
    // httplib sets SO_REUSEPORT, which lets a second server listen on the same port and share its
    // connections: SO_REUSEADDR alone still rebinds over TIME_WAIT but refuses a port in use.
    http.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      metrics.on_request();
      const bool needs_key = req.path.rfind("/v1/", 0) == 0 || (req.path == "/metrics" && !options.metrics_open);
      if (needs_key) {
        if (auto refused = options.api_keys.refuse(req.get_header_value("Authorization"))) {
          metrics.on_unauthorized();
          send_error(res, *refused);
          res.set_header("WWW-Authenticate", "Bearer");
          res.set_header("Connection", "close");  // its body (if any) is not read
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      if (auto bad = bad_framing(req, options.max_body_bytes)) {  // before httplib reads the body
        ApiError e;
        e.http_status = bad->first;
        e.param = bad->first == 413 ? "body" : "Content-Length";
        e.message = bad->second;
        send_error(res, e);
        res.set_header("Connection", "close");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
      if (t_handoff == nullptr) metrics.on_response(res.status);
      if (res.get_header_value("Connection") == "close") t_close_after = true;
    });
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // our own error objects
      ApiError e;
      e.http_status = res.status;
      if (res.status == 404) {
        e.type = "not_found_error";
        e.message = "no route " + req.method + " " + req.path;
      } else if (res.status == 413) {
        e.message = "body: larger than the server's limit (--max-body-bytes)";
        e.param = "body";
      } else {
        e.message = "bad request (HTTP " + std::to_string(res.status) + ")";
      }
      send_error(res, e);
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      ApiError e;
      e.http_status = 500;
      e.type = "server_error";
      e.message = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& ex) {
        e.message = std::string("internal error: ") + ex.what();
      } catch (...) {
      }
      send_error(res, e);
    });
    http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) {
      completions(q, s, Endpoint::kCompletions);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) {
      completions(q, s, Endpoint::kChatCompletions);
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& s) {
      json data = json::array({json{{"id", options.model_name},
                                    {"object", "model"},
                                    {"created", started},
                                    {"owned_by", "diffucoder.cpp"}}});
      for (const std::string& name : model.adapter_names())  // serve --lora NAME=DIR: over the base
        data.push_back(json{{"id", name}, {"object", "model"}, {"created", started}, {"owned_by", "diffucoder.cpp"},
                            {"parent", options.model_name}});
      send_json(s, 200, json{{"object", "list"}, {"data", std::move(data)}});
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& s) {
      send_json(s, 200, json{{"status", "ok"}, {"queue_depth", metrics.queue_depth()}, {"active_rows", metrics.active_rows()}});
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& s) {
      s.set_content(metrics.render(), "text/plain; version=0.0.4");
    });
    if (options.web_page) {
      http.Get("/", [this](const httplib::Request&, httplib::Response& s) {
        s.set_content(std::string(web_page(!options.api_keys.empty())), "text/html; charset=utf-8");
      });
    }
    // Browsers ask for it on every page load: no icon, and no 404 in their console.
    http.Get("/favicon.ico", [](const httplib::Request&, httplib::Response& s) { s.status = 204; });
  }
};

HttpServer::HttpServer(const diffucoder::Model& model, ServerOptions options) {
  if (options.model_name.empty()) options.model_name = "diffucoder";
  impl_ = std::make_unique<Impl>(model, std::move(options), metrics_);
  impl_->stop_ids = model.stop_ids();
  impl_->mask_id = model.info().mask_token_id;
  diffucoder::Result<std::unique_ptr<diffucoder::BatchEngine>> batch =
      diffucoder::BatchEngine::create(model, impl_->options.scheduler, &metrics_);
  if (batch.ok()) {
    impl_->batch = std::move(*batch);
  } else {
    impl_->batch_status = from_public(batch.status()).with_context("serve");
  }
  impl_->routes();
}

HttpServer::~HttpServer() {
  stop();
  if (impl_->batch) impl_->batch->stop();
}

Status HttpServer::bind() {
  if (!impl_->batch) return impl_->batch_status;
  // Every open connection is a file descriptor: raise the soft limit to what --max-connections needs.
  const rlim_t needed = static_cast<rlim_t>(impl_->options.connections.max_connections) + 256;
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < needed) {
    lim.rlim_cur = std::min(needed, lim.rlim_max);
    setrlimit(RLIMIT_NOFILE, &lim);
    if (lim.rlim_cur < needed)
      return invalid_argument("--max-connections " + std::to_string(impl_->options.connections.max_connections) +
                              " needs " + std::to_string(needed) + " file descriptors, but the hard limit (ulimit -Hn) is " +
                              std::to_string(lim.rlim_max) + "; lower --max-connections or raise the limit");
  }
  const std::string& host = impl_->options.host;
  if (impl_->options.port == 0) {
    port_ = impl_->http.bind_to_any_port(host);
    if (port_ <= 0) return io_error("serve: cannot bind " + host + " to a free port");
  } else {
    if (!impl_->http.bind_to_port(host, impl_->options.port))
      return io_error("serve: cannot bind " + host + ":" + std::to_string(impl_->options.port) +
                      " (in use, or not an address of this machine)");
    port_ = impl_->options.port;
  }
  impl_->http.raise_backlog(SOMAXCONN);
  return Status::ok_status();
}

void HttpServer::run() { impl_->http.listen_after_bind(); }

void HttpServer::stop() {
  // Finish every job first (an error for the unfinished ones), so that open streams end with an error
  // event and `data: [DONE]` rather than being cut; then close the listener and the connections.
  if (impl_->batch) impl_->batch->stop();
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  while (impl_->open_streams.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  std::call_once(impl_->stopped, [this] {
    impl_->hub->stop();  // no new requests start; waiting connections close
    if (impl_->http.is_running()) impl_->http.stop();
    impl_->workers.shutdown();  // the requests being served end (their jobs have ended)
  });
}

}  // namespace dc::server
