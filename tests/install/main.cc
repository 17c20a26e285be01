// A program that knows only the installed public API: loads a checkpoint, generates greedily through the
// facade and prints the generated ids ("ids: 1,2,3"), which consumer_test.sh compares with the installed
// CLI's. Exit 1 on any failure, naming it. Usage: consumer MODEL_DIR N_NEW_TOKENS
#include <diffucoder/diffucoder.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

int fail(const std::string& what) {
  std::fprintf(stderr, "consumer: %s\n", what.c_str());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: consumer MODEL_DIR N_NEW_TOKENS");
  int notes = 0;  // the callback is the public one; nothing here needs it to fire
  diffucoder::set_log_callback([&notes](diffucoder::LogLevel, std::string_view) { ++notes; });

  auto missing = diffucoder::Model::load({.model_dir = "/nonexistent/model"});
  if (missing.ok() || missing.status().message().find("/nonexistent/model") == std::string::npos)
    return fail("loading a missing directory did not fail naming it: " + missing.status().to_string());

  diffucoder::LoadOptions options;
  options.model_dir = argv[1];
  options.threads = 2;
  options.precision = "f32";
  options.weight_cache = "off";
  auto model = diffucoder::Model::load(options);
  if (!model.ok()) return fail(model.status().to_string());
  diffucoder::GenerationConfig c = (*model)->default_config();
  const int64_t n_new = std::stoll(argv[2]);
  c.max_new_tokens = n_new;
  c.steps = static_cast<int>(n_new);
  c.temperature = 0;
  c.alg = "entropy";
  int steps_seen = 0;
  diffucoder::Hooks hooks;
  hooks.on_step = [&steps_seen](const diffucoder::StepEvent&) { ++steps_seen; return true; };
  const diffucoder::Result<diffucoder::Generation> out = (*model)->generate({{1, 2, 3}}, c, hooks);
  if (!out.ok()) return fail(out.status().to_string());
  const std::vector<int32_t> ids = out->generated(0);
  if (static_cast<int64_t>(ids.size()) != n_new || steps_seen < 1)
    return fail("generated " + std::to_string(ids.size()) + " ids in " + std::to_string(steps_seen) + " steps, wanted " +
                std::to_string(n_new));
  std::printf("ids: ");
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? "," : "", ids[i]);
  std::printf("\n");
  diffucoder::set_log_callback(nullptr);
  return 0;
}
