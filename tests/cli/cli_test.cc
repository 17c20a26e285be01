// The diffucoder binary end to end on the tiny fixture checkpoints: generate (text, --json, --visual,
// JSONL batches), tokenize, inspect, and bad input (clear message naming the culprit, non-zero exit).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fixtures.h"
#include "ops/cpu/quant.h"
#include "process.h"
#include "temp_dir.h"

namespace dc {
namespace {

namespace fs = std::filesystem;

using testing::run_binary;

using testing::small_model;
using testing::vocab_model;

TEST(Cli, GenerateJsonIsValidAndComplete) {
  auto r = run_binary("generate --model " + vocab_model() + " --prompt 'def add(a, b):' --max-new-tokens 12 --steps 6 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["text"].is_string());
  ASSERT_TRUE(j["token_ids"].is_array());
  EXPECT_EQ(j["token_ids"].size(), 12u);
  EXPECT_EQ(j["timings"]["steps"].get<int>(), 6);
  EXPECT_GT(j["timings"]["total_ms"].get<double>(), 0.0);
  EXPECT_NE(r.err.find("step 6/6"), std::string::npos) << "progress on stderr: " << r.err;
}

TEST(Cli, GenerateIsDeterministicForASeed) {
  const std::string args = "generate --model " + vocab_model() +
                           " --prompt 'x = 1' --max-new-tokens 8 --temperature 0.8 --top-p 0.9 --seed 7 --json --quiet";
  auto a = run_binary(args), b = run_binary(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["token_ids"], nlohmann::json::parse(b.out)["token_ids"]);
  EXPECT_TRUE(a.err.empty()) << "--quiet prints nothing: " << a.err;
}

TEST(Cli, VisualDrawsTheCanvasUnmasking) {
  auto r = run_binary("generate --model " + vocab_model() + " --chat --prompt 'hi' --max-new-tokens 6 --steps 3 --visual");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--- step 1/3 ---"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--- step 3/3 ---"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\u2591"), std::string::npos) << "masks drawn before the last step: " << r.err;
}

TEST(Cli, JsonlBatchWithIdsTextAndMessages) {
  const test::TempDir tmp("cli_jsonl");
  const fs::path dir = tmp.path();
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"import os\"}\n"
                                 << "{\"prompt_ids\": [1, 2, 3, 4, 5, 6]}\n"
                                 << "{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}]}\n";
  auto r = run_binary("generate --model " + vocab_model() + " --prompts-jsonl " + (dir / "p.jsonl").string() +
               " --max-new-tokens 5 --num-return-sequences 2 --json --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["index"].get<int>(), n);
    EXPECT_EQ(j["prompt_index"].get<int>(), n / 2);
    EXPECT_EQ(j["token_ids"].size(), 5u);
    ++n;
  }
  EXPECT_EQ(n, 6);
}

TEST(Cli, PromptIdsWithoutTokenizerPrintIds) {
  auto r = run_binary("generate --model " + small_model() + " --prompt-ids 5,6,7 --max-new-tokens 4 --alg maskgit_plus --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(','), std::string::npos) << r.out;
}

TEST(Cli, TokenizeRoundTrip) {
  auto enc = run_binary("tokenize --model " + vocab_model() + " --text 'def f(x):\n    return x<|mask|>'");
  ASSERT_EQ(enc.exit_code, 0) << enc.err;
  auto ids = nlohmann::json::parse(enc.out);
  ASSERT_TRUE(ids.is_array());
  EXPECT_EQ(ids.back().get<int>(), 151666);
  auto dec = run_binary("tokenize --model " + vocab_model() + " --decode --text '" + ids.dump() + "'");
  ASSERT_EQ(dec.exit_code, 0) << dec.err;
  EXPECT_EQ(dec.out, "def f(x):\n    return x<|mask|>\n");
}

TEST(Cli, InspectCountsParameters) {
  auto r = run_binary("inspect --model " + small_model() + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const auto& c = j["config"];
  const int64_t E = c["hidden_size"], F = c["intermediate_size"], V = c["vocab_size"], L = c["num_hidden_layers"];
  const int64_t q = c["num_attention_heads"].get<int64_t>() * c["head_dim"].get<int64_t>();
  const int64_t kv = c["num_key_value_heads"].get<int64_t>() * c["head_dim"].get<int64_t>();
  const int64_t per_layer = 2 * E + (E * q + q) + 2 * (E * kv + kv) + q * E + 3 * E * F;
  EXPECT_EQ(j["parameters"].get<int64_t>(), 2 * V * E + E + L * per_layer);
}

struct BadCase {
  std::string args;
  std::string expect_in_error;
};

// bench on the tiny synthetic shape in every weight format and matmul precision: a complete run whose
// JSON reports the settings, one timing per step and a forward rate.
TEST(Cli, BenchRunsEveryWeightFormatAndPrecision) {
  for (const std::string weights : {"bf16", "q8", "q4"})
    for (const std::string precision : {"f32", "bf16"}) {
      const std::string args = "bench --shape tiny --prompt-len 8 --new-tokens 16 --steps 4 --no-peak --json --threads 2"
                               " --weights " + weights + " --precision " + precision;
      auto r = run_binary(args);
      ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.err;
      auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["weights"], weights);
      EXPECT_EQ(j["precision"], precision);
      EXPECT_EQ(j["steps_run"], 4);
      EXPECT_TRUE(j["complete"].get<bool>());
      EXPECT_GT(j["achieved_gflops"].get<double>(), 0.0) << args;
      EXPECT_GT(j["peak_rss_bytes"].get<int64_t>(), 0) << args;
    }
  // --layers / --vocab reshape the synthetic model (the last two ids of the vocabulary the mask and the pad).
  auto reshaped = run_binary("bench --shape tiny --layers 3 --vocab 64 --prompt-len 8 --new-tokens 16 --steps 4 --no-peak --json");
  ASSERT_EQ(reshaped.exit_code, 0) << reshaped.err;
  const auto rj = nlohmann::json::parse(reshaped.out);
  EXPECT_EQ(rj["layers"], 3);
  EXPECT_EQ(rj["vocab"], 64);
  EXPECT_TRUE(rj["complete"].get<bool>());
  for (const auto& row : rj["generated"])
    for (const auto& id : row) EXPECT_LT(id.get<int>(), 64);
  auto on_checkpoint = run_binary("bench --model " + small_model() + " --layers 1 --no-peak");
  EXPECT_EQ(on_checkpoint.exit_code, 2);
  EXPECT_NE(on_checkpoint.err.find("--layers and --vocab change a --shape"), std::string::npos) << on_checkpoint.err;
  // Block decoding with the dual cache: fewer positions per forward (a block's 8 against the canvas' 24), same JSON.
  auto r = run_binary("bench --shape tiny --prompt-len 8 --new-tokens 16 --steps 4 --no-peak --json --cache dual "
               "--block-length 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto dual = nlohmann::json::parse(r.out);
  EXPECT_EQ(dual["cache"], "dual");
  EXPECT_EQ(rj["rows_per_forward"].get<double>(), 24.0);
  EXPECT_LT(dual["rows_per_forward"].get<double>(), 24.0);
  // The committed cache: fewer rows per step than dual's; --refresh-every below 1 is refused naming it.
  const double dual_rows = dual["rows_per_step"].get<double>();
  auto committed = run_binary("bench --shape tiny --prompt-len 8 --new-tokens 16 --steps 16 --no-peak --json "
                              "--cache committed --refresh-every 1000 --block-length 8");
  ASSERT_EQ(committed.exit_code, 0) << committed.err;
  const auto cj = nlohmann::json::parse(committed.out);
  EXPECT_EQ(cj["cache"], "committed");
  EXPECT_EQ(cj["refresh_every"], 1000);
  auto dual16 = run_binary("bench --shape tiny --prompt-len 8 --new-tokens 16 --steps 16 --no-peak --json --cache dual "
                           "--block-length 8");
  ASSERT_EQ(dual16.exit_code, 0) << dual16.err;
  EXPECT_LT(cj["rows_per_step"].get<double>(), nlohmann::json::parse(dual16.out)["rows_per_step"].get<double>());
  EXPECT_GT(dual_rows, 0.0);
  for (const char* cmd : {"bench --shape tiny --no-peak --cache committed --refresh-every 0",
                          "generate --model . --prompt-ids 1 --cache committed --refresh-every -2"}) {
    auto bad = run_binary(cmd);
    EXPECT_EQ(bad.exit_code, 2) << cmd;
    EXPECT_NE(bad.err.find("--refresh-every"), std::string::npos) << cmd << ": " << bad.err;
  }
}

// bench --profile: a step's time split into the layers' GEMMs, attention, the lm_head, the sampling and the rest,
// each measured (> 0: every step runs each) and the rest not negative; the GEMMs' rate, and the int8 GEMM peak
// beside the bf16 one where the machine has the int8 kernel (AVX-512 VNNI). On a device, refused.
TEST(Cli, BenchProfileSplitsAStep) {
  auto r = run_binary("bench --shape tiny --prompt-len 8 --new-tokens 16 --steps 8 --json --threads 2 --weights q8 --profile");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& b = j["step_breakdown_ms"];
  for (const char* part : {"layer_gemms", "attention", "lm_head", "sampling"}) EXPECT_GT(b[part].get<double>(), 0.0) << part;
  EXPECT_GE(b["rest"].get<double>(), 0.0);
  EXPECT_GT(j["layer_gemm_gops"].get<double>(), 0.0);
  EXPECT_GT(j["peak_gemm_gflops"].get<double>(), 0.0);
  if (cpu::cpu_has_avx512_vnni()) EXPECT_GT(j["peak_int8_gemm_gops"].get<double>(), 0.0);
  else EXPECT_EQ(j["peak_int8_gemm_gops"].get<double>(), 0.0);
  auto plain = run_binary("bench --shape tiny --prompt-len 8 --new-tokens 16 --steps 4 --json --no-peak");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_FALSE(nlohmann::json::parse(plain.out).contains("step_breakdown_ms"));  // timers off by default
  auto device = run_binary("bench --shape tiny --device vulkan --profile --no-peak");
  EXPECT_EQ(device.exit_code, 2);
  EXPECT_NE(device.err.find("--profile"), std::string::npos) << device.err;
}

TEST(Cli, BenchTrainTimesOptimizerStepsAndRejectsBadShapes) {
  // The second run also measures the bf16 GEMM peak, on the tiny shape cut to 1 layer and 64 tokens,
  // with the per-op profile.
  for (const std::string extra : {" --no-peak", " --grad-checkpointing --layers 1 --vocab 64 --profile"}) {
    auto r = run_binary("bench --train --shape tiny --seq-len 32 --prompt-len 8 --steps 2 --threads 2 --json" + extra);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    const bool second = extra != " --no-peak";
    EXPECT_EQ(j["mode"], "train");
    EXPECT_EQ(j["losses"].size(), 2u);
    EXPECT_EQ(j["grad_checkpointing"].get<bool>(), second);
    EXPECT_EQ(j["layers"].get<int64_t>(), second ? 1 : 2);
    EXPECT_EQ(j["vocab"].get<int64_t>(), second ? 64 : 4096);
    EXPECT_EQ(j["peak_gemm_gflops"].get<double>() > 0, second);
    EXPECT_EQ(j["fraction_of_peak"].get<double>() > 0, second);
    for (const auto& s : j["per_step"]) {
      EXPECT_GT(s["loss"].get<double>(), 0.0);
      EXPECT_GT(s["n_loss_rows"].get<int64_t>(), 0);
    }
    EXPECT_GT(j["peak_rss_bytes"].get<int64_t>(), 0);
    ASSERT_EQ(j.contains("profile"), second);
    if (!second) continue;
    const auto& profile = j["profile"];  // path → per-step seconds and calls of the timed steps
    EXPECT_EQ(profile["forward"]["calls_per_step"].get<double>(), 1.0);
    EXPECT_EQ(profile["cross_entropy"]["calls_per_step"].get<double>(), 1.0);
    int backward_products = 0;
    for (const auto& [path, e] : profile.items()) {
      EXPECT_GE(e["seconds_per_step"].get<double>(), 0.0) << path;
      backward_products += path.rfind("backward/matmul_nt_backward", 0) == 0;
    }
    EXPECT_GT(backward_products, 0);
  }
  auto bad = run_binary("bench --train --shape nope");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("'nope'"), std::string::npos) << bad.err;
  auto small_vocab = run_binary("bench --train --shape tiny --vocab 8");
  EXPECT_EQ(small_vocab.exit_code, 2);
  EXPECT_NE(small_vocab.err.find("--vocab"), std::string::npos) << small_vocab.err;
}

TEST(Cli, GenerateWithBf16Precision) {
  auto r = run_binary("generate --model " + small_model() + " --prompt-ids 1,2,3 --max-new-tokens 8 --precision bf16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"].size(), 8u) << r.out;
}

// The default matmul precision follows the checkpoint (bf16 weights: bf16 activations, as the reference
// under torch_dtype=bfloat16); --precision f32 is the exact path.
TEST(Cli, DefaultPrecisionFollowsTheCheckpoint) {
  const std::string bf16_model = dc::testing::fixtures_dir() + "/tiny-gqa4-bf16";
  const std::string args = " --prompt-ids 1,2,3 --max-new-tokens 4 --weight-cache off --json";
  auto bf16 = run_binary("generate --model " + bf16_model + args);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_NE(bf16.err.find("matmul precision bf16"), std::string::npos) << bf16.err;
  auto f32 = run_binary("generate --model " + small_model() + args);
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  EXPECT_NE(f32.err.find("matmul precision f32"), std::string::npos) << f32.err;
  auto exact = run_binary("generate --model " + bf16_model + args + " --precision f32");
  ASSERT_EQ(exact.exit_code, 0) << exact.err;
  EXPECT_NE(exact.err.find("matmul precision f32"), std::string::npos) << exact.err;
  auto bench = run_binary("bench --model " + bf16_model + " --prompt-len 3 --new-tokens 4 --steps 4 --no-peak --json --weight-cache off");
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  EXPECT_EQ(nlohmann::json::parse(bench.out)["precision"], "bf16");
  auto serve = run_binary("serve --model " + bf16_model + " --precision f16 --port 0");
  EXPECT_NE(serve.exit_code, 0);
  EXPECT_NE(serve.err.find("--precision 'f16'"), std::string::npos) << serve.err;
  // The server's default: it says what it loaded before it starts serving (stopped once it has said it, or
  // after 60 s: loading takes seconds under the sanitizers on a loaded machine). SIGTERM, not SIGINT: a
  // background job of a non-interactive shell starts with SIGINT ignored, so a SIGINT that came before the
  // server's handler was lost and the test waited forever; SIGKILL after 30 s more bounds the wait.
  const test::TempDir tmp("cli_precision");
  const std::string log = (std::filesystem::path(tmp.path()) / "serve.log").string();
  for (const auto& [model, want] : {std::pair{bf16_model, "matmul precision bf16"}, {vocab_model(), "matmul precision bf16"},
                                    {small_model(), "matmul precision f32"}}) {
    // (the log is emptied first, in this shell: the background job's own `2>` truncation can come after the
    // first grep, which then saw the previous model's line and stopped a server that had not started)
    auto s = testing::run_command("{ : > " + log + "; " + std::string(DC_BINARY_PATH) + " serve --model " + model +
                                  " --port 0 --host 127.0.0.1 --weight-cache off 2>" + log + " & pid=$!; i=0; "
                                  "while ! grep -q 'matmul precision' " + log + " && kill -0 $pid 2>/dev/null && "
                                  "[ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; kill -TERM $pid; i=0; "
                                  "while kill -0 $pid 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
                                  "kill -KILL $pid 2>/dev/null; wait $pid; cat " +
                                  log + " >&2; }");
    EXPECT_NE(s.err.find(want), std::string::npos) << model << ": " << s.err;
  }
}

// --fast is Fast-dLLM's defaults (blocks of 32, dual cache, threshold 0.9) and nothing else.
TEST(Cli, FastModeIsItsThreeFlags) {
  const std::string base = "generate --model " + vocab_model() + " --prompt 'def add(a, b):' --max-new-tokens 40 --json --quiet";
  auto fast = run_binary(base + " --fast");
  auto flags = run_binary(base + " --block-length 32 --cache dual --threshold 0.9");
  auto exact = run_binary(base);
  ASSERT_EQ(fast.exit_code, 0) << fast.err;
  ASSERT_EQ(flags.exit_code, 0) << flags.err;
  ASSERT_EQ(exact.exit_code, 0) << exact.err;
  const auto jf = nlohmann::json::parse(fast.out), jl = nlohmann::json::parse(flags.out);
  EXPECT_EQ(jf["token_ids"], jl["token_ids"]);
  EXPECT_EQ(jf["timings"]["steps"], jl["timings"]["steps"]);
  // Threshold decoding commits several tokens in some steps: fewer steps than the exact 40.
  EXPECT_LE(jf["timings"]["steps"].get<int>(), nlohmann::json::parse(exact.out)["timings"]["steps"].get<int>());
}

// eval generates through the facade; its sampler flags are checked before the model loads, as usage errors
// (exit 2) as generate's are: a bad --alg or --top-p with a model that does not exist names the flag, not the path.
TEST(Cli, EvalChecksItsSamplerFlagsBeforeLoading) {
  const test::TempDir tmp("cli_eval_flags");
  const std::string base = "eval --benchmark " + std::string(DC_SOURCE_DIR) +
                           "/data/humaneval/HumanEval.jsonl.gz --limit 1 --quiet --model /nonexistent-model --out " +
                           tmp.file("r.jsonl");
  for (const auto& [flag, message] : {std::pair<std::string, std::string>{" --alg fastest", "fastest"},
                                      {" --top-p 0", "top_p"}}) {
    auto r = run_binary(base + flag);
    if (r.err.find("sandbox is not available") != std::string::npos) GTEST_SKIP() << "no sandbox here: " << r.err;
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << flag << ": " << r.err;
    EXPECT_EQ(r.err.find("/nonexistent-model"), std::string::npos) << flag << ": " << r.err;
  }
}

TEST(Cli, BadInputGivesClearErrorAndNonZeroExit) {
  const test::TempDir tmp("cli_bad");
  const fs::path dir = tmp.path();
  // A checkpoint whose config.json disagrees with its tensors, and one with a corrupt safetensors header.
  fs::copy(small_model(), dir / "wrong_shape", fs::copy_options::recursive);
  {
    auto cfg = dc::testing::load_json((dir / "wrong_shape" / "config.json").string());
    cfg["intermediate_size"] = cfg["intermediate_size"].get<int>() + 1;
    std::ofstream(dir / "wrong_shape" / "config.json") << cfg.dump();
  }
  fs::copy(small_model(), dir / "corrupt", fs::copy_options::recursive);
  fs::resize_file(dir / "corrupt" / "model.safetensors", 20);
  fs::copy(small_model(), dir / "bad_config", fs::copy_options::recursive);
  std::ofstream(dir / "bad_config" / "config.json") << "{\"hidden_size\": \"big\"}";
  const std::string ok_model = " --model " + small_model() + " --prompt-ids 1,2,3 ";
  const std::vector<BadCase> cases = {
      {"generate --model /nonexistent/dir --prompt-ids 1", "/nonexistent/dir"},
      {"generate --model " + (dir / "wrong_shape").string() + " --prompt-ids 1", "mlp.gate_proj.weight"},
      {"generate --model " + (dir / "corrupt").string() + " --prompt-ids 1", "model.safetensors"},
      {"generate --model " + (dir / "bad_config").string() + " --prompt-ids 1", "hidden_size"},
      {"generate" + ok_model + "--max-new-tokens 10000000", "max_position_embeddings"},
      {"generate" + ok_model + "--top-p 1.5", "top_p"},
      {"generate" + ok_model + "--temperature -1", "temperature"},
      {"generate" + ok_model + "--steps -3", "steps"},
      {"generate" + ok_model + "--alg fastest", "fastest"},
      {"generate --model " + small_model() + " --prompt-ids 1,x,3", "'x'"},
      {"generate --model " + small_model() + " --prompt-ids 1,99999", "99999"},
      {"generate --model " + small_model() + " --prompt 'text needs a tokenizer'", "tokenizer"},
      {"generate --model " + small_model(), "--prompt"},
      {"tokenize --tokenizer /nonexistent.json --text a", "/nonexistent.json"},
      {"tokenize --model " + vocab_model() + " --decode --text 999999999", "999999999"},
      {"generate" + ok_model + "--precision f16", "--precision 'f16'"},
      {"bench --shape tiny --weights q3", "--weights 'q3'"},
      {"bench --shape tiny --precision half", "--precision 'half'"},
      {"bench --shape huge", "--shape 'huge'"},
      {"bench --model " + small_model() + " --weights q8", "diffucoder convert"},
      {"bench --shape tiny --weights q4 --group-size 33", "--group-size 33"},
      {"generate" + ok_model + "--device gpu", "--device 'gpu'"},
      {"bench --shape tiny --device cuda:0", "--device 'cuda:0'"},
  };
  for (const auto& c : cases) {
    auto r = run_binary(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.exit_code, -1) << "crashed: " << c.args;
    EXPECT_NE(r.err.find(c.expect_in_error), std::string::npos) << c.args << "\nstderr: " << r.err;
  }
}

}  // namespace
}  // namespace dc
