// Server metrics: counters and gauges updated by the HTTP handlers and the engine thread, rendered in the
// Prometheus text format for GET /metrics. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

#include <diffucoder/batch.h>

namespace dc::server {

// The engine side is the BatchEngine's observer (the scheduler reports each step, job and queue change).
class Metrics final : public diffucoder::BatchObserver {
 public:
  // HTTP side.
  void on_request() { requests_.fetch_add(1); }
  void on_response(int http_status);  // counts 2xx / 4xx / 5xx
  void on_rejected() { rejected_.fetch_add(1); }  // queue full or queue timeout (503)
  void on_disconnect() { disconnects_.fetch_add(1); }
  void on_connection_refused() { connections_refused_.fetch_add(1); }  // over --max-connections(-per-client)
  void on_connection_timeout() { connections_timed_out_.fetch_add(1); }  // request head not in time
  void on_unauthorized() { unauthorized_.fetch_add(1); }                // 401: no or a wrong API key
  void on_slow_reader() { slow_readers_.fetch_add(1); }  // a stream's reader too far behind, or stalled: dropped
  void set_connections_open(int64_t n) { connections_open_.store(n); }

  // Engine side: one batched step of `rows` rows that committed `tokens` tokens.
  void on_step(double seconds, double forward_seconds, int64_t rows, int64_t tokens) override;
  void on_job_done(double queue_seconds, double run_seconds) override;
  void set_queue_depth(int64_t n) override { queue_depth_.store(n); }
  void set_active_rows(int64_t n) override { active_rows_.store(n); }

  int64_t queue_depth() const { return queue_depth_.load(); }
  int64_t active_rows() const { return active_rows_.load(); }
  int64_t connections_open() const { return connections_open_.load(); }
  int64_t steps() const { return steps_.load(); }
  int64_t slow_readers() const { return slow_readers_.load(); }
  // Tokens committed per second over the last 10 s.
  double tokens_per_second() const;

  // The Prometheus text exposition (version 0.0.4).
  std::string render() const;

 private:
  using Clock = std::chrono::steady_clock;
  std::atomic<int64_t> requests_{0}, responses_2xx_{0}, responses_4xx_{0}, responses_5xx_{0}, rejected_{0},
      disconnects_{0}, connections_refused_{0}, connections_timed_out_{0}, unauthorized_{0}, slow_readers_{0},
      connections_open_{0}, steps_{0}, rows_stepped_{0}, tokens_{0}, jobs_done_{0}, queue_depth_{0}, active_rows_{0};
  mutable std::mutex mu_;
  double step_seconds_ = 0.0, forward_seconds_ = 0.0, queue_seconds_ = 0.0, run_seconds_ = 0.0;
  std::deque<std::pair<Clock::time_point, int64_t>> recent_;  // (time, tokens) of the last 10 s of steps
};

}  // namespace dc::server
