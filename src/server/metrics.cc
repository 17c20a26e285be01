// Metrics: atomic counters plus a mutex-guarded window of recent steps for the tokens/s gauge.
#include "server/metrics.h"

#include <cstdio>

namespace dc::server {
namespace {

constexpr double kWindowSeconds = 10.0;

void line(std::string& out, const char* name, const char* type, const char* help, double value) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, value);
  out += buf;
}

}  // namespace

void Metrics::on_response(int http_status) {
  if (http_status >= 500) {
    responses_5xx_.fetch_add(1);
  } else if (http_status >= 400) {
    responses_4xx_.fetch_add(1);
  } else {
    responses_2xx_.fetch_add(1);
  }
}

void Metrics::on_step(double seconds, double forward_seconds, int64_t rows, int64_t tokens) {
  steps_.fetch_add(1);
  rows_stepped_.fetch_add(rows);
  tokens_.fetch_add(tokens);
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  step_seconds_ += seconds;
  forward_seconds_ += forward_seconds;
  recent_.emplace_back(now, tokens);
  while (!recent_.empty() && std::chrono::duration<double>(now - recent_.front().first).count() > kWindowSeconds)
    recent_.pop_front();
}

void Metrics::on_job_done(double queue_seconds, double run_seconds) {
  jobs_done_.fetch_add(1);
  std::lock_guard<std::mutex> lock(mu_);
  queue_seconds_ += queue_seconds;
  run_seconds_ += run_seconds;
}

double Metrics::tokens_per_second() const {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  int64_t tokens = 0;
  for (const auto& [t, n] : recent_)
    if (std::chrono::duration<double>(now - t).count() <= kWindowSeconds) tokens += n;
  return static_cast<double>(tokens) / kWindowSeconds;
}

std::string Metrics::render() const {
  std::string out;
  line(out, "dc_requests_total", "counter", "HTTP requests received", static_cast<double>(requests_.load()));
  out += "# HELP dc_responses_total HTTP responses by status class\n# TYPE dc_responses_total counter\n";
  out += "dc_responses_total{class=\"2xx\"} " + std::to_string(responses_2xx_.load()) + "\n";
  out += "dc_responses_total{class=\"4xx\"} " + std::to_string(responses_4xx_.load()) + "\n";
  out += "dc_responses_total{class=\"5xx\"} " + std::to_string(responses_5xx_.load()) + "\n";
  line(out, "dc_requests_rejected_total", "counter", "requests refused with 503 (queue full or queue timeout)",
       static_cast<double>(rejected_.load()));
  line(out, "dc_client_disconnects_total", "counter", "requests whose client went away before the end",
       static_cast<double>(disconnects_.load()));
  line(out, "dc_connections_open", "gauge", "client connections open (waiting for a request or served)",
       static_cast<double>(connections_open_.load()));
  line(out, "dc_connections_refused_total", "counter", "connections refused with 503 over the connection caps",
       static_cast<double>(connections_refused_.load()));
  line(out, "dc_connections_timed_out_total", "counter", "connections closed because a request head did not arrive in time",
       static_cast<double>(connections_timed_out_.load()));
  line(out, "dc_slow_readers_dropped_total", "counter",
       "streams dropped because their reader fell too far behind or took nothing for --io-timeout",
       static_cast<double>(slow_readers_.load()));
  line(out, "dc_unauthorized_total", "counter", "requests refused with 401 (no or a wrong API key)",
       static_cast<double>(unauthorized_.load()));
  line(out, "dc_queue_depth", "gauge", "requests waiting for a batch slot", static_cast<double>(queue_depth_.load()));
  line(out, "dc_active_rows", "gauge", "canvas rows in the running batch", static_cast<double>(active_rows_.load()));
  line(out, "dc_tokens_per_second", "gauge", "tokens committed per second over the last 10 s", tokens_per_second());
  line(out, "dc_tokens_committed_total", "counter", "tokens unmasked by all steps",
       static_cast<double>(tokens_.load()));
  line(out, "dc_rows_stepped_total", "counter", "sum over steps of the rows in the batch",
       static_cast<double>(rows_stepped_.load()));
  line(out, "dc_jobs_completed_total", "counter", "generations finished (any outcome)",
       static_cast<double>(jobs_done_.load()));
  std::lock_guard<std::mutex> lock(mu_);
  out += "# HELP dc_step_seconds latency of one batched diffusion step (forward + sampling)\n";
  out += "# TYPE dc_step_seconds summary\n";
  char buf[256];
  std::snprintf(buf, sizeof(buf), "dc_step_seconds_sum %.17g\ndc_step_seconds_count %lld\n", step_seconds_,
                static_cast<long long>(steps_.load()));
  out += buf;
  line(out, "dc_forward_seconds_total", "counter", "time in the model's forward", forward_seconds_);
  line(out, "dc_queue_seconds_total", "counter", "time requests waited in the queue", queue_seconds_);
  line(out, "dc_run_seconds_total", "counter", "time requests spent in the batch", run_seconds_);
  return out;
}

}  // namespace dc::server
