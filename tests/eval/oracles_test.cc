// MBPP+ in EvalPlus' format (issue 38): each input rule (tuples, sets, complex numbers rebuilt from JSON) and
// each special oracle, on hand-written MBPP+ tasks in EvalPlus' exact layout, through `diffucoder eval` in the
// sandbox. Each canonical solution asserts the argument types EvalPlus' rules give, so the expected outputs
// are computed only when the inputs are rebuilt as EvalPlus rebuilds them, and the canonical solution, sent
// as a sample, passes only when the candidate's process gets them too; known-wrong programs fail the right
// column with the right kind; programs that are right only by an oracle pass; malformed inputs are refused
// naming the file, the task, the key and the argument.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/oracles.h"
#include "process.h"
#include "results_lines.h"
#include "sandbox/sandbox.h"
#include "temp_dir.h"

namespace dc::eval::oracles {
namespace {

// One MBPP+ task: the fields EvalPlus' MbppPlus.jsonl has (the prompt is a docstring of the text and one
// assertion; canonical_solution a whole program; base_input / plus_input lists of argument lists).
struct PlusTask {
  int n;
  std::string entry_point, canonical;
  nlohmann::json base, plus;
  std::string contract;
  double atol = 0;
};

std::string line_of(const PlusTask& t) {
  const std::string assertion = "assert " + t.entry_point + "(...) is not None";
  return nlohmann::json{{"task_id", "Mbpp/" + std::to_string(t.n)},
                        {"prompt", "\"\"\"\nWrite a function " + t.entry_point + ".\n" + assertion + "\n\"\"\"\n"},
                        {"entry_point", t.entry_point},
                        {"canonical_solution", t.canonical},
                        {"base_input", t.base},
                        {"plus_input", t.plus},
                        {"atol", t.atol},
                        {"contract", t.contract},
                        {"assertion", assertion}}
      .dump();
}

using nlohmann::json;

PlusTask task(int n, const std::string& entry_point, const std::string& canonical, json base, json plus,
              const std::string& contract = "") {
  return {n, entry_point, canonical, std::move(base), std::move(plus), contract, 0};
}

// One task per input rule, and one per MBPP oracle (Mbpp/2 has both a rule and the set_equal oracle).
std::vector<PlusTask> plus_tasks() {
  return {
      task(2, "similar_elements",
       "def similar_elements(test_tup1, test_tup2):\n    assert type(test_tup1) is tuple and type(test_tup2) is tuple\n"
       "    return tuple(set(test_tup1) & set(test_tup2))\n",
       json::parse("[[[3, 4, 5, 6], [5, 7, 4, 10]], [[1, 2, 3, 4], [5, 4, 3, 7]]]"),
       json::parse("[[[11, 12, 14, 13], [17, 15, 14, 13]], [[1, 2], [3, 4]]]"),
       "\n    assert isinstance(test_tup1, tuple), \"invalid inputs\" # $_CONTRACT_$\n"
       "    assert isinstance(test_tup2, tuple), \"invalid inputs\" # $_CONTRACT_$\n"),
      task(63, "max_difference",
       "def max_difference(test_list):\n    assert all(type(p) is tuple for p in test_list)\n"
       "    return max(abs(b - a) for a, b in test_list)\n",
       json::parse("[[[[3, 5], [1, 7], [10, 3], [1, 2]]]]"), json::parse("[[[[4, 6], [2, 17], [9, 13], [11, 12]]]]")),
      task(75, "find_tuples",
       "def find_tuples(test_list, K):\n"
       "    assert type(test_list) is list and all(type(t) is tuple for t in test_list) and type(K) is int\n"
       "    return [t for t in test_list if all(e % K == 0 for e in t)]\n",
       json::parse("[[[[6, 24, 12], [7, 9, 6], [12, 18, 21]], 6]]"), json::parse("[[[[5, 25, 30], [4, 2, 3]], 5]]")),
      task(106, "add_lists",
       "def add_lists(test_list, test_tup):\n    assert type(test_list) is list and type(test_tup) is tuple\n"
       "    return test_tup + tuple(test_list)\n",
       json::parse("[[[5, 6, 7], [9, 10]]]"), json::parse("[[[6, 7, 8], [10, 11]]]")),
      task(115, "empty_dit",
       "def empty_dit(list1):\n    assert all(type(d) is set if d else type(d) is dict for d in list1)\n"
       "    return all(not d for d in list1)\n",
       json::parse("[[[[1, 2], [], [3]]]]"), json::parse("[[[[], []]]]")),
      task(124, "angle_complex",
       "import cmath\ndef angle_complex(a, b):\n    assert type(a) is float and type(b) is complex\n"
       "    return cmath.phase(a + b)\n",
       json::parse(R"j([["0.0", "1j"], ["2.0", "(1+2j)"]])j"), json::parse(R"j([["0.0", "(-3+4j)"]])j")),
      task(250, "count_X",
       "def count_X(tup, x):\n    assert type(tup) is tuple\n    return tup.count(x)\n",
       json::parse("[[[10, 8, 5, 2, 10, 15, 10, 8], 10], [[10, 8, 5], 4]]"), json::parse(R"j([[[1, 2, 3], "a"], [[1, 1], 1]])j"),
       // plus input 0 breaks the contract (x is a string): left out, for the canonical solution and every sample
       "\n    assert isinstance(tup, tuple), \"invalid inputs\" # $_CONTRACT_$\n"
       "    assert isinstance(x, int), \"invalid inputs\" # $_CONTRACT_$\n"),
      task(259, "maximize_elements",
       "def maximize_elements(test_tup1, test_tup2):\n"
       "    assert type(test_tup1) is tuple and all(type(t) is tuple for t in test_tup1 + test_tup2)\n"
       "    return tuple(tuple(max(a, b) for a, b in zip(t1, t2)) for t1, t2 in zip(test_tup1, test_tup2))\n",
       json::parse("[[[[1, 3], [4, 5], [2, 9]], [[6, 7], [3, 9], [1, 1]]]]"), json::parse("[[[[2, 4], [5, 6]], [[7, 8], [4, 10]]]]")),
      task(278, "count_first_elements",
       "def count_first_elements(test_tup):\n    assert type(test_tup) is tuple\n"
       "    for count, ele in enumerate(test_tup):\n        if isinstance(ele, tuple):\n            break\n    return count\n",
       json::parse("[[[1, 5, 7, [4, 6], 10]]]"), json::parse("[[[2, 9, [5, 7], 11]]]")),
      task(307, "colon_tuplex",
       "from copy import deepcopy\ndef colon_tuplex(tuplex, m, n):\n    assert type(tuplex) is tuple and type(tuplex[m]) is list\n"
       "    tuplex_colon = deepcopy(tuplex)\n    tuplex_colon[m].append(n)\n    return tuplex_colon\n",
       json::parse(R"j([[["HELLO", 5, [], true], 2, 50]])j"), json::parse(R"j([[["HELLO", 5, [], true], 2, 100]])j")),
      task(722, "filter_data",
       "def filter_data(students, h, w):\n    assert all(type(s) is tuple for s in students.values())\n"
       "    return {k: s for k, s in students.items() if s[0] >= h and s[1] >= w}\n",
       json::parse(R"j([[{"Cierra Vega": [6.2, 70], "Alden Cantrell": [5.9, 65]}, 6.0, 70]])j"),
       json::parse(R"j([[{"Kierra Gentry": [6.0, 68]}, 5.9, 67]])j")),
      task(252, "convert",
       "import cmath\ndef convert(numbers):\n    assert type(numbers) is complex\n    return cmath.polar(numbers)\n",
       json::parse(R"j([["(1+2j)"], ["(4+0j)"]])j"), json::parse(R"j([["(-1-1j)"]])j")),
      task(580, "extract_even",
       "def extract_even(test_tuple):\n    assert type(test_tuple) is tuple\n"
       "    return tuple(extract_even(e) if isinstance(e, tuple) else e for e in test_tuple\n"
       "                 if isinstance(e, tuple) or e % 2 == 0)\n",
       json::parse("[[[4, 5, [7, 6, [2, 4]], 6, 8]]]"), json::parse("[[[5, 6, [8, 7, [4, 8]], 7, 9]]]")),
      // the oracles
      task(164, "are_equivalent",
       "import math\ndef div_sum(n):\n    total, i = 1, 2\n    while i * i <= n:\n        if n % i == 0:\n"
       "            total = total + i + math.floor(n / i)\n        i += 1\n    return total\n"
       "def are_equivalent(num1, num2):\n    return div_sum(num1) == div_sum(num2)\n",
       json::parse("[[36, 57], [2, 4], [23, 47]]"), json::parse("[[10, 15]]")),
      task(295, "sum_div",
       "def sum_div(number):\n    return sum([1] + [i for i in range(2, number) if number % i == 0])\n",
       json::parse("[[8], [12], [7]]"), json::parse("[[1]]")),
      task(581, "surface_Area", "def surface_Area(b, s):\n    return 2 * b * s + pow(b, 2)\n", json::parse("[[3, 4], [4, 5]]"),
       json::parse("[[1, 2]]")),
      task(558, "digit_distance_nums", "def digit_distance_nums(n1, n2):\n    return sum(map(int, str(abs(n1 - n2))))\n",
       json::parse("[[1, 2], [23, 56], [123, 19]]"), json::parse("[[123, 256]]")),
      task(787, "text_match_three", "import re\ndef text_match_three(text):\n    return re.search('ab{3}?', text)\n",
       json::parse(R"j([["ac"], ["dc"], ["abbbba"]])j"), json::parse(R"j([["caacabbbba"]])j")),
  };
}

// A sample and the kinds its two columns must get ("none": passed).
struct Case {
  int n;
  std::string solution, base, plus;
};

std::vector<Case> cases(const std::vector<PlusTask>& tasks) {
  std::vector<Case> out;
  for (const PlusTask& t : tasks) out.push_back({t.n, t.canonical, "none", "none"});  // every canonical solution
  const std::vector<Case> more = {
      // set_equal: another order and another container pass; a wrong set fails
      {2, "def similar_elements(a, b):\n    return sorted(set(a) & set(b), reverse=True)\n", "none", "none"},
      {2, "def similar_elements(a, b):\n    return tuple(set(a) | set(b))\n", "assertion", "assertion"},
      {2, "def similar_elements(a, b):\n    assert type(a) is list\n    return []\n", "assertion", "assertion"},
      {63, "def max_difference(l):\n    return min(abs(b - a) for a, b in l)\n", "assertion", "assertion"},
      {75, "def find_tuples(l, K):\n    return [list(t) for t in l if all(e % K == 0 for e in t)]\n", "assertion", "assertion"},
      {106, "def add_lists(l, t):\n    return tuple(l) + t\n", "assertion", "assertion"},
      {115, "def empty_dit(l):\n    return any(not d for d in l)\n", "assertion", "assertion"},
      {124, "import cmath\ndef angle_complex(a, b):\n    return cmath.phase(b)\n", "assertion", "assertion"},
      // right on every input the contract keeps, wrong on the one it leaves out: passes
      {250, "def count_X(tup, x):\n    return tup.count(x) if isinstance(x, int) else -1\n", "none", "none"},
      {250, "def count_X(tup, x):\n    return len(tup)\n", "assertion", "assertion"},
      {259, "def maximize_elements(a, b):\n    return tuple(tuple(min(x, y) for x, y in zip(p, q)) for p, q in zip(a, b))\n",
       "assertion", "assertion"},
      // counts up to the first list: there is none, the inner lists are tuples
      {278, "def count_first_elements(t):\n    for c, e in enumerate(t):\n        if isinstance(e, list):\n"
            "            break\n    return c\n", "assertion", "assertion"},
      {307, "def colon_tuplex(t, m, n):\n    return t\n", "assertion", "assertion"},
      {722, "def filter_data(s, h, w):\n    return {k: list(v) for k, v in s.items() if v[0] >= h and v[1] >= w}\n",
       "assertion", "assertion"},
      {252, "def convert(z):\n    return (abs(z), 0.0)\n", "assertion", "assertion"},
      // treats the nested tuples as lists: `%` on a tuple raises
      {580, "def extract_even(t):\n    return tuple(e for e in t if isinstance(e, list) or e % 2 == 0)\n", "exception",
       "exception"},
      // any_answer: any value returned passes, raising does not
      {164, "def are_equivalent(a, b):\n    return False\n", "none", "none"},
      // (an answer that is not data, which could not travel back, passes too, as in EvalPlus)
      {164, "def are_equivalent(a, b):\n    return object()\n", "none", "none"},
      {164, "def are_equivalent(a, b):\n    raise ValueError('no')\n", "exception", "exception"},
      // expected_or_zero
      {295, "def sum_div(n):\n    return 0\n", "none", "none"},
      {295, "def sum_div(n):\n    return 1\n", "assertion", "assertion"},
      // surface_area: the perpendicular height's surface (35 and 59 where the canonical says 33 and 56) passes
      {581, "import math\ndef surface_Area(b, h):\n    return round(b ** 2 + 2 * b * math.sqrt((b / 2) ** 2 + h ** 2))\n",
       "none", "none"},
      {581, "def surface_Area(b, s):\n    return b * b\n", "assertion", "assertion"},
      // digit_distance: the digits of the zero-padded numbers (8 where the canonical says 5 for 123, 19) pass
      {558, "def digit_distance_nums(a, b):\n    x, y = str(a), str(b)\n    w = max(len(x), len(y))\n"
            "    return sum(abs(int(p) - int(q)) for p, q in zip(x.zfill(w), y.zfill(w)))\n", "none", "none"},
      {558, "def digit_distance_nums(a, b):\n    return 0\n", "assertion", "assertion"},
      // not_none: a re.Match (not plain data) is compared as `is not None`, a bool as itself
      {787, "import re\ndef text_match_three(text):\n    return bool(re.search('ab{3}?', text))\n", "none", "none"},
      {787, "import re\ndef text_match_three(text):\n    return re.search('x', text)\n", "assertion", "assertion"},
      {787, "def text_match_three(text):\n    return True\n", "assertion", "assertion"},
  };
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

// The results file's sample lines by (task_id, sample).
const auto records = testing::results_lines;

Task mbpp_plus_task(const std::string& id, const std::string& entry_point) {
  Task t;
  t.task_id = id;
  t.entry_point = entry_point;
  t.has_inputs = true;
  t.dataset = id.rfind("Mbpp/", 0) == 0 ? Dataset::kMbpp : Dataset::kHumanEval;
  return t;
}

TEST(EvalPlusRules, RulesAndOraclesByTask) {
  EXPECT_EQ(input_rule(mbpp_plus_task("Mbpp/2", "similar_elements")), json::parse(R"j({"args": [], "rest": "tuple"})j"));
  EXPECT_EQ(input_rule(mbpp_plus_task("Mbpp/124", "angle_complex")),
            json::parse(R"j({"args": ["float", "complex"], "rest": null})j"));
  EXPECT_EQ(input_rule(mbpp_plus_task("Mbpp/722", "filter_data")),
            json::parse(R"j({"args": ["dict_values_tuple"], "rest": "same"})j"));
  EXPECT_TRUE(input_rule(mbpp_plus_task("Mbpp/3", "is_not_prime")).is_null());
  EXPECT_TRUE(input_rule(mbpp_plus_task("Mbpp/2x", "f")).is_null());
  EXPECT_TRUE(input_rule(mbpp_plus_task("HumanEval/2", "truncate_number")).is_null());
  Task original = mbpp_plus_task("Mbpp/2", "similar_elements");
  original.has_inputs = false;  // the original MBPP: checked by its asserts, no rules
  EXPECT_TRUE(input_rule(original).is_null());
  EXPECT_EQ(special_oracle(original), "");

  EXPECT_EQ(special_oracle(mbpp_plus_task("HumanEval/32", "find_zero")), "find_zero");
  EXPECT_EQ(special_oracle(mbpp_plus_task("Mbpp/32", "find_zero")), "");
  EXPECT_EQ(special_oracle(mbpp_plus_task("HumanEval/2", "sum_div")), "");  // MBPP's oracles are MBPP's only
  EXPECT_EQ(special_oracle(mbpp_plus_task("Mbpp/295", "sum_div")), "expected_or_zero");
  EXPECT_EQ(special_oracle(mbpp_plus_task("Mbpp/769", "Diff")), "set_equal");
  EXPECT_EQ(special_oracle(mbpp_plus_task("Mbpp/737", "check_str")), "not_none");
  EXPECT_EQ(special_oracle(mbpp_plus_task("Mbpp/3", "is_not_prime")), "");
}

// Runs every case of the tasks numbered `numbers` through `diffucoder eval` and checks each sample's two columns.
void expect_cases(const std::set<int>& numbers) {
  const test::TempDir dir("oracles");
  std::vector<PlusTask> tasks;
  for (const PlusTask& t : plus_tasks())
    if (numbers.count(t.n)) tasks.push_back(t);
  ASSERT_EQ(tasks.size(), numbers.size());
  std::vector<Case> all;
  for (const Case& c : cases(tasks))
    if (numbers.count(c.n)) all.push_back(c);
  {
    std::ofstream bench(dir.file("MbppPlus.jsonl"));
    for (const PlusTask& t : tasks) bench << line_of(t) << "\n";
    std::ofstream samples(dir.file("samples.jsonl"));
    for (const Case& c : all) samples << json{{"task_id", "Mbpp/" + std::to_string(c.n)}, {"solution", c.solution}}.dump() << "\n";
  }
  auto r = testing::run_binary("eval --benchmark " + dir.file("MbppPlus.jsonl") + " --completions " +
                               dir.file("samples.jsonl") + " --out " + dir.file("results.jsonl") + " --cache-dir " +
                               dir.file("cache") + " --workers 4 --quiet --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto recs = records(dir.file("results.jsonl"));
  std::map<int, int> next;
  for (const Case& c : all) {
    const std::string id = "Mbpp/" + std::to_string(c.n);
    const json& rec = recs[{id, next[c.n]++}];
    SCOPED_TRACE(id + ": " + c.solution);
    EXPECT_EQ(rec["failure"], c.base) << rec.dump();
    EXPECT_EQ(rec["passed_base"], c.base == "none") << rec.dump();
    EXPECT_EQ(rec["failure_plus"], c.plus) << rec.dump();
    EXPECT_EQ(rec["passed_plus"], c.plus == "none") << rec.dump();
  }
  auto j = json::parse(r.out);
  EXPECT_EQ(j["tasks"], static_cast<int>(tasks.size()));
  EXPECT_EQ(j["samples"], static_cast<int>(all.size()));
}

// Every input rule but Mbpp/2's ("tuple", with the oracles below).
TEST(EvalPlusRules, MbppPlusInputRulesInTheSandbox) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  expect_cases({63, 75, 106, 115, 124, 250, 259, 278, 307, 722, 252, 580});
}

// Every MBPP special oracle (Mbpp/2: set_equal, its inputs tuples, its contract after the def line).
TEST(EvalPlusRules, MbppPlusSpecialOraclesInTheSandbox) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  expect_cases({2, 164, 295, 581, 558, 787});
}

TEST(EvalPlusRules, InputsThatDoNotFitTheirRuleNameTheTaskAndTheArgument) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("oracles");
  const std::vector<std::pair<PlusTask, std::string>> bad = {
      {task(124, "angle_complex", "def angle_complex(a, b):\n    return 0.0\n", json::parse(R"j([["0.0", "1j"]])j"),
        json::parse(R"j([["1.0", "1j"], ["zero", "1j"]])j")),
       ": Mbpp/124: \"plus_input\"[1]: argument 0 cannot be made float (ValueError: could not convert string to float"},
      {task(75, "find_tuples", "def find_tuples(l, K):\n    return l\n", json::parse("[[[[1, 2]]]]"), json::parse("[]")),
       ": Mbpp/75: \"base_input\"[0]: 1 arguments where the task takes 2"},
  };
  for (const auto& [task, message] : bad) {
    const std::string bench = dir.file("bad" + std::to_string(task.n) + ".jsonl");
    std::ofstream(bench) << line_of(task) << "\n";
    std::ofstream(dir.file("s.jsonl")) << json{{"task_id", "Mbpp/" + std::to_string(task.n)}, {"solution", task.canonical}}.dump()
                                       << "\n";
    auto r = testing::run_binary("eval --benchmark " + bench + " --completions " + dir.file("s.jsonl") + " --out " +
                                 dir.file("r.jsonl") + " --force --cache-dir " + dir.file("cache") + " --quiet");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(bench + message), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace dc::eval::oracles
