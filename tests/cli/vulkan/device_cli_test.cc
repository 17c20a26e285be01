// `--device vulkan` end to end on device 0 (lavapipe in CI): `diffucoder generate` and one `serve` chat
// completion over 127.0.0.1 give the CPU's output for a deterministic request (temperature 0 with top-k and
// top-p on: the filters and the confidences computed on the device). The checkpoint is tiny-vocab (the real
// 152k vocabulary and the Qwen2 tokenizer) read as 2 heads of 16 (1 KV head): the same tensors, a head size
// the device's attention takes. Both devices run f32 (--precision f32), so only the device's rounding differs.
// `train`, `grpo` and `grpo-loss --device vulkan` give the CPU's losses; what a device run does not support is
// refused by name. (The engine's unmerged LoRA adapters on the device: forward_vulkan_test.cc and
// scheduler_vulkan_test.cc, whose tiny models cost a fraction of this 152k vocabulary's time.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fixtures.h"
#include "head_dim_16.h"
#include "loopback.h"
#include "process.h"
#include "temp_dir.h"

namespace dc {
namespace {

namespace fs = std::filesystem;

// tiny-vocab's files (or those of the checkpoint `from`) in `dir`, its config read as 2 attention heads
// (head_dim 16) and 1 KV head.
void head_dim_16_copy(const std::string& dir, const fs::path& from = dc::testing::fixtures_dir() + "/tiny-vocab") {
  dc::testing::head_dim_16_copy(from, dir);
}

// `diffucoder serve ARGS --port 0` on its own process, its stderr in a file; the port read from it.
class Serve {
 public:
  Serve(const std::string& args, const std::string& err_path) : err_(err_path) {
    pid_ = fork();
    if (pid_ == 0) {
      if (!freopen(err_.c_str(), "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(127);
      const std::string cmd = std::string("exec ") + DC_BINARY_PATH + " serve --port 0 --threads 2 " + args;
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 600 && port_ == 0; ++i) {  // up to 30 s (loading and uploading the model)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const std::string text = stderr_text();
      const size_t at = text.find("http://127.0.0.1:");
      if (at != std::string::npos) port_ = std::atoi(text.c_str() + at + 17);
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
    }
  }
  ~Serve() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }
  std::string stderr_text() const {
    std::ifstream in(err_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string err_;
};

// POSTs `body` to `path` on 127.0.0.1:port; the whole response, head and body.
std::string exchange(int port, const std::string& path, const std::string& body) {
  const int fd = dc::testing::connect_to(port);
  const std::string request = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) response.append(buf, static_cast<size_t>(n));
  close(fd);
  return response;
}

// The JSON body of a response (null when there is none).
nlohmann::json body_of(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? nlohmann::json() : nlohmann::json::parse(response.substr(at + 4), nullptr, false);
}

// POSTs `body` to `path` on 127.0.0.1:port, expecting 200; the response's JSON body (null when there is none).
nlohmann::json post(int port, const std::string& path, const std::string& body) {
  const std::string response = exchange(port, path, body);
  EXPECT_NE(response.find(" 200 "), std::string::npos) << response;
  return body_of(response);
}

TEST(DeviceCli, GenerateOnVulkanEqualsTheCpu) {
  dc::test::TempDir dir("vulkan_cli");
  head_dim_16_copy(dir.path());
  nlohmann::json ids[2];
  int i = 0;
  for (const char* device : {"cpu", "vulkan"}) {
    const auto r = dc::testing::run_binary("generate --model " + dir.path() +
                                           " --prompt 'def add(a, b):' --max-new-tokens 4 --steps 2 --alg entropy"
                                           " --temperature 0 --top-k 20 --top-p 0.9 --precision f32 --threads 2 --json --quiet"
                                           " --device " + device);
    ASSERT_EQ(r.exit_code, 0) << device << ": " << r.err;
    ids[i++] = nlohmann::json::parse(r.out)["token_ids"];
  }
  ASSERT_EQ(ids[0].size(), 4u);
  EXPECT_EQ(ids[1], ids[0]);
}

TEST(DeviceCli, ServeChatCompletionOnVulkanEqualsTheCpu) {
  dc::test::TempDir dir("vulkan_serve");
  head_dim_16_copy(dir.path());
  const std::string body = R"({"messages": [{"role": "user", "content": "Write add(a, b)."}], "max_tokens": 4,
                               "temperature": 0, "top_p": 0.9, "top_k": 20, "steps": 2})";
  nlohmann::json answers[2];
  int i = 0;
  for (const char* device : {"cpu", "vulkan"}) {
    Serve serve("--model " + dir.path() + " --precision f32 --device " + device, dir.file(std::string(device) + ".err"));
    ASSERT_GT(serve.port(), 0) << device << ": " << serve.stderr_text();
    const nlohmann::json reply = post(serve.port(), "/v1/chat/completions", body);
    ASSERT_TRUE(reply.is_object()) << device;
    answers[i++] = reply["choices"][0]["message"]["content"];
    EXPECT_EQ(reply["usage"]["completion_tokens"].get<int>(), 4) << device << ": " << reply.dump();
  }
  ASSERT_TRUE(answers[0].is_string());
  EXPECT_EQ(answers[1], answers[0]);
}

// Issue 35 item 5: on a device the memory budget weighs the device's memory (a request's KV cache,
// activations and logits rows): a request that cannot fit in --max-memory is answered 503 naming the budget
// and the device, before any forward; one that fits is served; auto budgets the device's heap.
TEST(DeviceCli, ServeOnVulkanAnswers503ForARequestOverTheDeviceBudget) {
  dc::test::TempDir dir("vulkan_serve_budget");
  head_dim_16_copy(dir.path());
  {
    Serve serve("--model " + dir.path() + " --precision f32 --device vulkan --max-memory 8M", dir.file("small.err"));
    ASSERT_GT(serve.port(), 0) << serve.stderr_text();
    EXPECT_NE(serve.stderr_text().find("memory budget 8 MiB of device memory"), std::string::npos) << serve.stderr_text();
    // 64 masked positions × a logits row of the 152k vocabulary (608 KB) on the device: ~38 MiB > 8 MiB.
    const std::string big = exchange(serve.port(), "/v1/completions",
                                     R"({"prompt": "def f(x):", "max_tokens": 64, "steps": 8, "cache": "dual", "temperature": 0})");
    EXPECT_NE(big.find(" 503 "), std::string::npos) << big;
    const std::string message = body_of(big)["error"]["message"].get<std::string>();
    EXPECT_NE(message.find("--max-memory"), std::string::npos) << message;
    EXPECT_NE(message.find("MiB of memory on "), std::string::npos) << message;  // the device's name follows
    EXPECT_NE(message.find("KV cache"), std::string::npos) << message;
    const nlohmann::json small = post(serve.port(), "/v1/completions",
                                      R"({"prompt": "def f(x):", "max_tokens": 2, "steps": 1, "cache": "dual", "temperature": 0})");
    EXPECT_EQ(small["usage"]["completion_tokens"].get<int>(), 2) << small.dump();
  }
  Serve serve("--model " + dir.path() + " --precision f32 --device vulkan", dir.file("auto.err"));
  ASSERT_GT(serve.port(), 0) << serve.stderr_text();
  EXPECT_NE(serve.stderr_text().find("MiB of device memory"), std::string::npos) << serve.stderr_text();
}

// A step on the device is one submission (issue 35): the body's forward, the lm_head of the step's rows and
// the sampling, with the uploads and the readback, in the steady state of the uncached and the dual-cache
// modes (bench counts the submits of the steps after the first, which records the command buffers).
TEST(DeviceCli, BenchStepIsOneSubmission) {
  for (const char* cache : {"none", "dual"}) {
    const auto r = dc::testing::run_binary(std::string("bench --shape tiny --prompt-len 8 --new-tokens 16 --steps 8 --no-peak --json"
                                                       " --threads 2 --device vulkan --cache ") + cache);
    ASSERT_EQ(r.exit_code, 0) << cache << ": " << r.err;
    const nlohmann::json work = nlohmann::json::parse(r.out)["device_work_per_step"];
    ASSERT_TRUE(work.is_object() && work.contains("submits")) << cache << ": " << r.out;
    EXPECT_EQ(work["submits"].get<double>(), 1.0) << cache << ": " << work.dump();
    EXPECT_EQ(work["runs"].get<double>(), 1.0) << cache << ": " << work.dump();
  }
}

// `train --device vulkan` (the SFT step on the device, train/device_sft.h): one step of one sequence of 16
// tokens gives the CPU's loss, and its checkpoint is written (the device's weights downloaded); the same with
// LoRA adapters (`--lora-r 4`: a PEFT checkpoint; with `--lora-dropout` on the device: TrainerVulkan's LoRA test);
// `bench --train` (which would time the CPU) is refused naming the flag.
TEST(DeviceCli, TrainOnVulkanEqualsTheCpuOrRefusesByName) {
  dc::test::TempDir dir("vulkan_train");
  head_dim_16_copy(dir.path());
  {
    std::ofstream data(dir.file("data.jsonl"));
    for (int i = 0; i < 4; ++i)
      data << R"({"prompt": "def f)" << i << R"((x):", "completion": "    return x * )" << i << R"( + 1\n"})" << "\n";
  }
  const std::string common = "train --model " + dir.path() + " --data " + dir.file("data.jsonl") +
                             " --steps 1 --seq-len 16 --batch-size 1 --lr 1e-3 --precision f32 --threads 2 --quiet";
  for (const std::string lora : {"", " --lora-r 4"}) {
    double loss[2] = {0, 0};
    int i = 0;
    for (const char* device : {"cpu", "vulkan"}) {
      const std::string out = dir.file(std::string("out-") + device + (lora.empty() ? "" : "-lora"));
      const auto r = dc::testing::run_binary(common + lora + " --out " + out + " --device " + device);
      ASSERT_EQ(r.exit_code, 0) << device << lora << ": " << r.err;
      loss[i++] = nlohmann::json::parse(r.out)["final_loss"].get<double>();
      const char* saved = lora.empty() ? "model.safetensors" : "adapter_model.safetensors";
      EXPECT_TRUE(fs::exists(fs::path(out) / "checkpoint-000001" / saved)) << device << lora;
    }
    EXPECT_NEAR(loss[1], loss[0], 1e-5 * loss[0]) << lora;
  }
  const auto bench = dc::testing::run_binary("bench --train --shape tiny --steps 1 --device vulkan");
  EXPECT_NE(bench.exit_code, 0);
  EXPECT_NE(bench.err.find("--device"), std::string::npos) << bench.err;
}

// `grpo-loss --device vulkan` (train/grpo_loss.h grpo_loss_and_device_grads) on the grpo fixtures' clipped case
// (old log-probs, scaled rewards, a reference model), policy and reference read with head_dim 16: the loss, KL, clip
// fraction and every tensor's gradient norm equal to the CPU grpo-loss's within f32 bounds; --lora is refused by name.
TEST(DeviceCli, GrpoLossOnVulkanEqualsTheCpu) {
  dc::test::TempDir dir("vulkan_grpo_loss");
  fs::create_directories(dir.file("policy")), fs::create_directories(dir.file("ref"));
  head_dim_16_copy(dir.file("policy"), fs::path(DC_GRPO_FIXTURES_DIR) / "policy");
  head_dim_16_copy(dir.file("ref"), fs::path(DC_GRPO_FIXTURES_DIR) / "ref");
  const std::string common = "grpo-loss --model " + dir.file("policy") + " --ref-model " + dir.file("ref") + " --batch " +
                             DC_GRPO_FIXTURES_DIR + "/g4_clip.batch.json --json --threads 2 --device ";
  nlohmann::json out[2];
  int i = 0;
  for (const char* device : {"cpu", "vulkan"}) {
    const auto r = dc::testing::run_binary(common + device);
    ASSERT_EQ(r.exit_code, 0) << device << ": " << r.err;
    out[i++] = nlohmann::json::parse(r.out);
  }
  ASSERT_GT(out[0]["clip_fraction"].get<double>(), 0.0) << "the case clips";
  EXPECT_EQ(out[1]["clip_fraction"], out[0]["clip_fraction"]);
  for (const char* key : {"loss", "kl", "grad_norm"}) {
    const double want = out[0][key], got = out[1][key];
    EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << key;
  }
  ASSERT_EQ(out[1]["grad_norms"].size(), out[0]["grad_norms"].size());
  for (auto it = out[0]["grad_norms"].begin(); it != out[0]["grad_norms"].end(); ++it)
    EXPECT_NEAR(out[1]["grad_norms"][it.key()].get<double>(), it.value().get<double>(), 1e-5 * it.value().get<double>())
        << it.key();
  const auto lora = dc::testing::run_binary(common + "vulkan --lora " + dir.path());
  EXPECT_EQ(lora.exit_code, 2) << lora.err;
  EXPECT_NE(lora.err.find("--lora"), std::string::npos) << lora.err;
}

// `grpo --device vulkan`: one round on tiny-vocab (head_dim 16), rollouts sampled on the device (top-k 50,
// temperature 1, top-p 0.95: the defaults, over near-uniform 152k-token rows), the reference model's log-probs, the loss and the
// step there, the reward program on the CPU: the same rewards as the CPU's run, the same loss and gradient norm
// within f32 bounds, and a checkpoint with the reference model (a LoRA run on the device, with dropout:
// tests/train/vulkan/grpo_vulkan_test.cc). (The 152k
// vocabulary's lm_head passes take seconds each on lavapipe: one step, the unit tests cover the rest.)
TEST(DeviceCli, GrpoOnVulkanEqualsTheCpu) {
  dc::test::TempDir dir("vulkan_grpo");
  head_dim_16_copy(dir.path());
  std::ofstream(dir.file("grpo.jsonl")) << R"({"prompt": "Write f(x) returning x+1.", "tests": ["assert f(1) == 2"]})" "\n";
  std::ofstream(dir.file("reward.py")) << "import json, sys\n"
                                          "for line in sys.stdin:\n"
                                          "    print(json.loads(line)['completion'].count('e'))\n";
  const std::string common = "grpo --model " + dir.path() + " --data " + dir.file("grpo.jsonl") +
                             " --num-generations 2 --max-completion-length 4 --diffusion-steps 2 --steps 1 --num-iterations 1"
                             " --grad-accum 1 --lr 1e-3 --warmup-ratio 0 --max-grad-norm 0.01 --precision f32"
                             " --threads 2 --quiet --code-weight 0 --format-weight 0"
                             " --reward-program /usr/bin/python3 " + dir.file("reward.py");
  std::vector<nlohmann::json> steps[2];
  int i = 0;
  for (const char* device : {"cpu", "vulkan"}) {
    const std::string out = dir.file(std::string("out-") + device);
    const auto r = dc::testing::run_binary(common + " --out " + out + " --device " + device);
    ASSERT_EQ(r.exit_code, 0) << device << ": " << r.err;
    EXPECT_TRUE(fs::exists(fs::path(out) / "checkpoint-000001" / "ref_model.safetensors")) << device;
    std::ifstream metrics(fs::path(out) / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) steps[i].push_back(nlohmann::json::parse(line));
    ++i;
  }
  ASSERT_EQ(steps[0].size(), 1u);
  ASSERT_EQ(steps[1].size(), 1u);
  for (size_t k = 0; k < 1; ++k) {
    EXPECT_EQ(steps[1][k]["reward_mean"], steps[0][k]["reward_mean"]) << "step " << k + 1 << ": other rollouts";
    for (const char* key : {"loss", "grad_norm"}) {
      const double want = steps[0][k][key], got = steps[1][k][key];
      EXPECT_NEAR(got, want, 1e-5 * std::abs(want) + 1e-9) << key << " of step " << k + 1;
    }
  }
}

// --cache committed computes scattered positions, which the device kernels do not take: refused on a device
// with an error naming the flag's field, before any forward.
TEST(DeviceCli, CommittedCacheIsRefusedOnADevice) {
  const auto r = dc::testing::run_binary("bench --shape tiny --prompt-len 8 --new-tokens 16 --steps 8 --no-peak --threads 2"
                                         " --device vulkan --cache committed --block-length 8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cache: \"committed\" runs on the CPU only"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dc
