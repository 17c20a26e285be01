// Issue 23 "Hostile input": what a user or a file hands the `diffucoder` binary must end in a clear error
// (exit 1 runtime, 2 usage), never a signal, a hang or a runaway allocation. Every run is capped in memory
// and time, so a regression fails the test instead of taking the machine down.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fixtures.h"
#include "loopback.h"
#include "process.h"
#include "temp_dir.h"

namespace dc {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;
using testing::connect_to;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;  // ASan reserves terabytes of address space: cap time only
#else
constexpr bool kAsan = false;
#endif

// The binary under a 3 GB address-space cap and a time limit.
RunResult run_capped(const std::string& args, int seconds = 60) {
  const std::string cap = kAsan ? "" : "ulimit -v 3000000; ";
  return testing::run_command("(" + cap + "exec timeout " + std::to_string(seconds) + " " + DC_BINARY_PATH + " " +
                              args + ")");
}

using testing::small_model;
using testing::vocab_model;

// A copy of the tiny real-vocabulary model in which `edit` changes config.json: the directory `m` of the returned
// temporary directory.
test::TempDir model_with_config(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  test::TempDir tmp("hostile_" + name);
  const fs::path dir = tmp.path();
  fs::copy(vocab_model(), dir / "m", fs::copy_options::recursive);
  nlohmann::json c = testing::load_json((dir / "m" / "config.json").string());
  edit(c);
  std::ofstream(dir / "m" / "config.json") << c.dump();
  return tmp;
}

void expect_error(const RunResult& r, int code, const std::string& in_error, const std::string& what) {
  EXPECT_EQ(r.exit_code, code) << what << "\nstderr: " << r.err;
  EXPECT_NE(r.err.find(in_error), std::string::npos) << what << "\nstderr: " << r.err;
}

// Items 1 / 4: a canvas inside the context whose logits cannot fit is refused before allocating.
TEST(Hostile, HugeGenerationIsRefusedBeforeAllocating) {
  expect_error(run_capped("generate --model " + vocab_model() + " --prompt hi --max-new-tokens 131070 --steps 1 --quiet"),
               1, "GiB of logits", "item 4");
  // item 1's server side: --max-tokens whose one row cannot fit is a usage error at startup
  // a memory budget below one step's block of logits can serve nothing: a usage error at startup
  expect_error(run_capped("serve --model " + vocab_model() + " --port 0 --max-memory 1M"), 2, "--max-memory 1M",
               "block of logits");
  expect_error(run_capped("serve --model " + vocab_model() + " --port 0 --max-tokens 100000 --default-max-tokens 128"),
               2, "--max-tokens 100000", "item 1");
}

// Item 2: nesting in tokenizer.json is limited (the loaders recursed without a bound).
TEST(Hostile, DeeplyNestedTokenizerJsonIsRefused) {
  const test::TempDir tmp("hostile_nest");
  const fs::path dir = tmp.path();
  std::ifstream in(vocab_model() + "/tokenizer.json");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json t = nlohmann::json::parse(ss.str());
  for (const auto& [field, list, depth] : {std::tuple<const char*, const char*, int>{"pre_tokenizer", "pretokenizers", 20000},
                                          {"normalizer", "normalizers", 100000}}) {
    nlohmann::json copy = t;
    copy[field] = "__nested_here__";
    std::string text = copy.dump();
    std::string nested;
    for (int i = 0; i < depth; ++i) nested += std::string("{\"type\":\"Sequence\",\"") + list + "\":[";
    nested += std::string(field) == "normalizer" ? "{\"type\":\"NFC\"}" : "{\"type\":\"ByteLevel\"}";
    for (int i = 0; i < depth; ++i) nested += "]}";
    text.replace(text.find("\"__nested_here__\""), 17, nested);
    const fs::path file = dir / (std::string(field) + ".json");
    std::ofstream(file) << text;
    expect_error(run_capped("tokenize --tokenizer " + file.string() + " --text hi", 30), 1, "nest deeper than 64",
                 field);
  }
}

// Item 3 and 26: config.json sizes have limits, and what the file does not say is not invented.
TEST(Hostile, ConfigSizesAndFieldsAreChecked) {
  struct Case {
    std::string name;
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  };
  const Case cases[] = {
      {"layers", [](nlohmann::json& c) { c["num_hidden_layers"] = 1000000000; }, "\"num_hidden_layers\" is 1000000000"},
      {"layers7", [](nlohmann::json& c) { c["num_hidden_layers"] = 10000000; }, "limit of 1024"},
      {"vocab", [](nlohmann::json& c) { c["vocab_size"] = int64_t{1} << 40; }, "\"vocab_size\""},
      {"nokv", [](nlohmann::json& c) { c.erase("num_key_value_heads"); c["num_attention_heads"] = 4; },
       "absent from the file"},
      {"llama", [](nlohmann::json& c) { c["model_type"] = "llama"; }, "\"model_type\" is \"llama\""},
      {"int3", [](nlohmann::json& c) { c["torch_dtype"] = "int3"; }, "\"torch_dtype\" is \"int3\""},
      {"q8", [](nlohmann::json& c) { c["quantization"] = {{"format", "q8"}, {"group_size", 0}}; },
       "no matrix has a quantization scale"},
  };
  for (const Case& c : cases) {
    const test::TempDir tmp = model_with_config(c.name, c.edit);
    const fs::path m = fs::path(tmp.path()) / "m";
    const auto t0 = std::chrono::steady_clock::now();
    expect_error(run_capped("inspect --model " + m.string(), 30), 1, c.expect, c.name);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << c.name;
  }
  // A NUL byte and garbage after the object.
  const test::TempDir tmp = model_with_config("nul", [](nlohmann::json&) {});
  const fs::path m = fs::path(tmp.path()) / "m";
  std::ofstream(m / "config.json", std::ios::app) << std::string("\0garbage", 8);
  expect_error(run_capped("inspect --model " + m.string()), 1, "NUL byte", "NUL");
}

// Items 5, 6, 7, 24: counts from the command line have limits; usage errors exit 2 before any work.
TEST(Hostile, CountsAreLimited) {
  const std::string gen = "generate --model " + vocab_model() + " --prompt hi --quiet ";
  expect_error(run_capped(gen + "--max-new-tokens 8 --num-return-sequences 100000000"), 2, "num_return_sequences",
               "item 5");
  for (const char* threads : {"100000", "-3"}) {
    expect_error(run_capped(gen + "--max-new-tokens 4 --threads " + threads), 2, "--threads", threads);
    expect_error(run_capped("train --model " + vocab_model() + " --data x.jsonl --out /tmp/none --threads " + threads),
                 2, "--threads", threads);
    expect_error(run_capped("serve --model " + vocab_model() + " --threads " + threads), 2, "--threads", threads);
    expect_error(run_capped("bench --shape tiny --threads " + std::string(threads)), 2, "--threads", threads);
    expect_error(run_capped("convert --model x --out y --weights q8 --threads " + std::string(threads)), 2, "--threads",
                 threads);
  }
  expect_error(run_capped("bench --shape tiny --batch 4096 --prompt-len 16000000"), 2, "--batch ×", "bench sizes");
  expect_error(run_capped("bench --shape tiny --train --batch 4096 --seq-len 1000000"), 2, "--batch ×", "bench --train");
  expect_error(run_capped("train --model " + vocab_model() + " --data x.jsonl --out /tmp/none --batch-size 4096 "
                          "--seq-len 1000000"),
               2, "--batch-size × --seq-len", "train sizes");
  expect_error(run_capped(gen + "--max-new-tokens 4 --steps 1000000000"), 2, "--steps", "item 7");
  expect_error(run_capped(gen + "--max-new-tokens 4 --steps 0"), 2, "--steps: must be >= 1", "item 7, steps 0");
  const RunResult r = run_capped(gen + "--max-new-tokens 9223372036854775807");
  expect_error(r, 2, "max_new_tokens", "item 24");
  EXPECT_EQ(r.err.find("-9223372036854775"), std::string::npos) << "no overflowed length: " << r.err;
  EXPECT_EQ(r.err.find("canvas length -"), std::string::npos) << r.err;
}

// Items 8, 10, 25: only regular files of bounded size are read; a FIFO never blocks.
TEST(Hostile, OnlyRegularFilesAreRead) {
  const test::TempDir tmp("hostile_files");
  const fs::path dir = tmp.path();
  fs::copy(vocab_model(), dir / "zero", fs::copy_options::recursive);
  fs::remove(dir / "zero" / "tokenizer.json");
  fs::create_symlink("/dev/zero", dir / "zero" / "tokenizer.json");
  expect_error(run_capped("tokenize --model " + (dir / "zero").string() + " --text hi", 20), 1, "not a regular file",
               "tokenizer.json -> /dev/zero");
  expect_error(run_capped("generate --model " + vocab_model() + " --prompt-file /dev/zero --quiet", 20), 1,
               "--prompt-file", "--prompt-file /dev/zero");
  expect_error(run_capped("generate --model " + vocab_model() + " --prompt-file " + dir.string() + " --quiet", 20), 1,
               "a directory", "--prompt-file DIR");
  expect_error(run_capped("tokenize --model " + vocab_model() + " --text-file " + dir.string(), 20), 1, "a directory",
               "--text-file DIR");
  expect_error(run_capped("train --model " + vocab_model() + " --data " + dir.string() + " --out " +
                          (dir / "out").string(), 20),
               1, "a directory", "train --data DIR");
  // A safetensors index naming a FIFO.
  const fs::path m = dir / "fifo";
  fs::copy(vocab_model(), m, fs::copy_options::recursive);
  fs::rename(m / "model.safetensors", m / "real.safetensors");
  ASSERT_EQ(mkfifo((m / "model-00001-of-00001.safetensors").c_str(), 0600), 0);
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  for (const char* name : {"model.embed_tokens.weight", "model.norm.weight"})
    index["weight_map"][name] = "model-00001-of-00001.safetensors";
  fs::remove(m / "real.safetensors");
  std::ofstream(m / "model.safetensors.index.json") << index.dump();
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r = run_capped("generate --model " + m.string() + " --prompt hi --max-new-tokens 2 --quiet", 20);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("FIFO"), std::string::npos) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
}

// Item 9: a prompt that cannot fit the context is refused from its byte length, before tokenising.
TEST(Hostile, OversizedPromptIsRefusedBeforeTokenising) {
  const test::TempDir tmp = model_with_config("ctx", [](nlohmann::json& c) { c["max_position_embeddings"] = 64; });
  const fs::path dir = tmp.path(), m = dir / "m";
  const std::string big(4 << 20, 'a');
  std::ofstream(dir / "p.jsonl") << nlohmann::json{{"prompt", big}}.dump() << "\n";
  const auto t0 = std::chrono::steady_clock::now();
  expect_error(run_capped("generate --model " + m.string() + " --prompts-jsonl " + (dir / "p.jsonl").string() +
                          " --max-new-tokens 4 --quiet"),
               1, "bytes, so at least", "--prompts-jsonl");
  // train --data: the long example is skipped without tokenising; the short one trains.
  std::ofstream(dir / "d.jsonl") << nlohmann::json{{"prompt", big}, {"completion", "x"}}.dump() << "\n"
                                 << nlohmann::json{{"prompt", "def f():"}, {"completion", " return 1"}}.dump() << "\n";
  const RunResult r = run_capped("train --model " + vocab_model() + " --data " + (dir / "d.jsonl").string() +
                                 " --out " + (dir / "out").string() + " --steps 1 --seq-len 16 --batch-size 1 --threads 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("(1 skipped"), std::string::npos) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

// Item 20: the README's example ids (Hugging Face agrees).
TEST(Hostile, ReadmeTokenizeExample) {
  const RunResult r = run_capped("tokenize --model " + vocab_model() + " --text 'def f(x):'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[750,282,2075,1648]\n");
}

// Items 21, 22: usage errors exit 2 before the model is loaded; an empty text is a text.
TEST(Hostile, UsageErrorsExitTwoAndEmptyTextIsGiven) {
  const std::string missing = " --model /nonexistent/model ";  // never loaded: the flags are checked first
  expect_error(run_capped("generate" + missing + "--max-new-tokens 4"), 2, "give exactly one of --prompt", "none");
  expect_error(run_capped("generate" + missing + "--prompt a --prompt-ids 1"), 2, "give exactly one", "two");
  expect_error(run_capped("generate" + missing + "--prompt a --precision f16"), 2, "--precision 'f16'", "f16");
  expect_error(run_capped("bench --shape tiny --train --seq-len 32"), 2, "--prompt-len", "bench --train");
  expect_error(run_capped("serve" + missing + "--default-max-tokens 2000 --max-tokens 100"), 2,
               "--default-max-tokens 2000", "item 15");
  expect_error(run_capped("generate --model " + vocab_model() + " --prompt '' --max-new-tokens 4 --quiet"), 1,
               "--prompt: the prompt encodes to no tokens", "--prompt ''");
  const RunResult r = run_capped("tokenize --model " + vocab_model() + " --text ''");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[]\n");
}

// Items 23, 29: convert's messages and progress.
TEST(Hostile, ConvertMessagesAndProgress) {
  const test::TempDir tmp("hostile_convert");
  const fs::path dir = tmp.path();
  expect_error(run_capped("convert --model " + small_model() + " --out " + (dir / "a").string() +
                          " --weights q4 --group-size 33"),
               2, "(default 128)", "item 23");
  const RunResult r =
      run_capped("convert --model " + vocab_model() + " --out " + (dir / "b").string() + " --weights q4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: "), std::string::npos) << "kept matrices are announced: " << r.err;
  EXPECT_NE(r.err.find("(kept: columns not a multiple of --group-size)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("in 0.0 s"), std::string::npos) << r.err;
  // generate's first progress line carries no rate measured over nothing
  const RunResult g = run_capped("generate --model " + vocab_model() + " --prompt hi --max-new-tokens 4 --steps 4");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_EQ(g.err.find(" 0.0 ms/step"), std::string::npos) << g.err;
}

// Item 27: --prompts-jsonl errors say what is wrong and where.
TEST(Hostile, JsonlPromptErrors) {
  const test::TempDir tmp("hostile_jsonl");
  const fs::path dir = tmp.path();
  struct Case {
    std::string line, expect;
  };
  const Case cases[] = {
      {"{\"prompt\": ", "line 1: not valid JSON"},
      {"{\"prompt\": \"\xff\"}", "line 1: not valid JSON"},
      {"[1, 2]", "line 1: must be a JSON object"},
      {"{\"prompt\": \"a\", \"prompt_ids\": [1]}", "line 1: give exactly one of"},
      {"{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", "line 1: "},
  };
  for (const Case& c : cases) {
    std::ofstream(dir / "p.jsonl") << c.line << "\n";
    expect_error(run_capped("generate --model " + vocab_model() + " --prompts-jsonl " + (dir / "p.jsonl").string() +
                            " --max-new-tokens 2 --quiet"),
                 1, c.expect, c.line);
  }
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"\xff\"}\n";
  const RunResult utf8 = run_capped("generate --model " + vocab_model() + " --prompts-jsonl " +
                                    (dir / "p.jsonl").string() + " --max-new-tokens 2 --quiet");
  EXPECT_NE(utf8.err.find("UTF-8"), std::string::npos) << "invalid UTF-8 is named: " << utf8.err;
}

// Item 28: a resumed run names the option that differs, and a finished run can be extended.
TEST(Hostile, TrainResumeNamesTheDifferenceAndExtends) {
  const test::TempDir tmp("hostile_resume");
  const fs::path dir = tmp.path();
  {
    std::ofstream data(dir / "sft.jsonl");
    for (int i = 0; i < 4; ++i) data << R"({"prompt": "def f)" << i << R"((x):", "completion": " return x"})" << "\n";
  }
  const std::string common = "train --model " + vocab_model() + " --data " + (dir / "sft.jsonl").string() +
                             " --seq-len 16 --batch-size 1 --threads 2 --out " + (dir / "out").string();
  ASSERT_EQ(run_capped(common + " --steps 2").exit_code, 0);
  const RunResult differ = run_capped(common + " --steps 2 --resume --lr 1e-3");
  expect_error(differ, 1, "\n  lr: saved 1.0000000000000001e-05, now 0.001", "--lr differs");
  EXPECT_EQ(differ.err.find("seq_len"), std::string::npos) << "only the difference is named: " << differ.err;
  const RunResult longer = run_capped(common + " --steps 3 --resume");
  EXPECT_EQ(longer.exit_code, 0) << longer.err;
  EXPECT_NE(longer.err.find("--steps raised from 2 to 3"), std::string::npos) << longer.err;
  EXPECT_NE(longer.out.find("\"steps\": 3"), std::string::npos) << longer.out;
}

// `diffucoder serve ARGS` started in `cwd` under the same caps, on a free port read from its stderr.
class ServeProcess {
 public:
  ServeProcess(const std::string& args, const fs::path& cwd) {
    err_ = fs::temp_directory_path() / ("dc_hostile_serve_" + std::to_string(getpid()) + ".err");
    pid_ = fork();
    if (pid_ == 0) {
      if (chdir(cwd.c_str()) != 0) _exit(127);
      if (!freopen(err_.c_str(), "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(127);
      rlimit cpu{60, 60};
      setrlimit(RLIMIT_CPU, &cpu);
      if (!kAsan) {
        rlimit as{rlim_t{3} << 30, rlim_t{3} << 30};
        setrlimit(RLIMIT_AS, &as);
      }
      const std::string cmd = std::string("exec ") + DC_BINARY_PATH + " serve --port 0 --threads 2 " + args;
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 400 && port_ == 0; ++i) {  // up to 20 s
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const std::string text = stderr_text();
      const size_t at = text.find("http://127.0.0.1:");
      if (at != std::string::npos) port_ = std::atoi(text.c_str() + at + 17);
    }
  }
  ~ServeProcess() {
    if (pid_ > 0 && wait_exit(0) == -2) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    fs::remove(err_);
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string stderr_text() const {
    std::ifstream in(err_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The exit code once the process ended within `seconds`; -1 killed by a signal, -2 still running.
  int wait_exit(int seconds) {
    for (int i = 0; i <= seconds * 20; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      if (seconds > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -2;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  fs::path err_;
};

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

// Items 11, 12, 19 on the real process: the model name of `--model .`, a second server on the same port,
// and SIGTERM while a stream is open (it ends with [DONE], the process exits 0).
TEST(Hostile, ServeProcessNameSecondListenerAndSigterm) {
  ServeProcess serve("--model .", vocab_model());
  ASSERT_GT(serve.port(), 0) << serve.stderr_text();
  {
    const int fd = connect_to(serve.port());
    const std::string get = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    ASSERT_EQ(send(fd, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
    const std::string response = read_all(fd);
    close(fd);
    EXPECT_NE(response.find("\"id\":\"tiny-vocab\""), std::string::npos) << response;
  }
  const RunResult second = run_capped("serve --model " + vocab_model() + " --threads 2 --port " +
                                      std::to_string(serve.port()), 30);
  expect_error(second, 1, "in use", "second listener");

  const int fd = connect_to(serve.port());
  const std::string body = R"({"prompt": "x", "max_tokens": 512, "stream": true})";
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(send(fd, post.data(), post.size(), MSG_NOSIGNAL), static_cast<ssize_t>(post.size()));
  char first[64];
  ASSERT_GT(recv(fd, first, sizeof(first), 0), 0);
  ASSERT_EQ(kill(serve.pid(), SIGTERM), 0);
  const std::string rest = read_all(fd);
  close(fd);
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos) << rest.substr(rest.size() > 1500 ? rest.size() - 1500 : 0);
  EXPECT_EQ(serve.wait_exit(15), 0) << serve.stderr_text();
}

}  // namespace
}  // namespace dc
