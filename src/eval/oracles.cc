#include "eval/oracles.h"

#include <map>
#include <set>
#include <vector>

namespace dc::eval {

namespace {

// A group of MBPP+ tasks that share one input rule.
struct RuleGroup {
  std::vector<int> tasks;
  std::vector<const char*> args;  // conversion of argument 0, 1, ...
  const char* rest;               // of every further argument; nullptr: dropped
};

// The MBPP+ tasks whose inputs EvalPlus rebuilds (mbpp_deserialize_inputs), by task number.
const std::map<int, nlohmann::json>& mbpp_rules() {
  static const std::map<int, nlohmann::json> kRules = [] {
    const std::vector<RuleGroup> groups = {
        {{2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726, 740, 744, 809},
         {},
         "tuple"},
        {{63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780}, {}, "tuple_items"},
        {{75, 413, 444, 753}, {"tuple_items", "same"}, nullptr},
        {{106, 750}, {"same", "tuple"}, nullptr},
        {{115}, {"set_items"}, nullptr},
        {{124}, {"float", "complex"}, nullptr},
        {{250, 405, 446, 617, 720, 763, 808}, {"tuple", "same"}, nullptr},
        {{259, 401, 445}, {}, "tuple_of_tuples"},
        {{278}, {"tuple_lists"}, nullptr},
        {{307}, {"tuple", "same", "same"}, nullptr},
        {{722}, {"dict_values_tuple"}, "same"},
        {{252}, {"complex"}, nullptr},
        {{580, 615, 791}, {}, "deep_tuple"},
    };
    std::map<int, nlohmann::json> rules;
    for (const RuleGroup& g : groups) {
      const nlohmann::json rule = {{"args", g.args},
                                   {"rest", g.rest ? nlohmann::json(g.rest) : nlohmann::json(nullptr)}};
      for (int n : g.tasks) rules[n] = rule;
    }
    return rules;
  }();
  return kRules;
}

// N of an MBPP+ task id "Mbpp/N" (-1 when it is not of that form).
int mbpp_number(const std::string& task_id) {
  if (task_id.rfind("Mbpp/", 0) != 0 || task_id.size() == 5 || task_id.size() > 14) return -1;
  int n = 0;
  for (size_t i = 5; i < task_id.size(); ++i) {
    if (task_id[i] < '0' || task_id[i] > '9') return -1;
    n = n * 10 + (task_id[i] - '0');
  }
  return n;
}

}  // namespace

nlohmann::json input_rule(const Task& task) {
  if (!task.has_inputs || task.dataset != Dataset::kMbpp) return nullptr;
  auto it = mbpp_rules().find(mbpp_number(task.task_id));
  return it == mbpp_rules().end() ? nlohmann::json(nullptr) : it->second;
}

std::string special_oracle(const Task& task) {
  if (!task.has_inputs) return "";
  if (task.dataset == Dataset::kHumanEval) return task.entry_point == "find_zero" ? "find_zero" : "";
  static const std::map<std::string, std::string> kByEntryPoint = {
      {"are_equivalent", "any_answer"},      {"sum_div", "expected_or_zero"},
      {"surface_Area", "surface_area"},      {"digit_distance_nums", "digit_distance"},
      {"similar_elements", "set_equal"},     {"find_char_long", "set_equal"},
      {"common_in_nested_lists", "set_equal"}, {"extract_singly", "set_equal"},
      {"larg_nnum", "set_equal"},            {"intersection_array", "set_equal"},
      {"find_dissimilar", "set_equal"},      {"Diff", "set_equal"},
      {"check_str", "not_none"},             {"text_match_three", "not_none"},
      {"text_starta_endb", "not_none"},
  };
  auto it = kByEntryPoint.find(task.entry_point);
  return it == kByEntryPoint.end() ? "" : it->second;
}

const char* const kEvalPlusPython = R"PY(import math
def _dc_deep_tuple(x):
    return tuple(_dc_deep_tuple(e) for e in x) if type(x) is list else x
_DC_CONVERT = {
    'same': lambda x: x,
    'tuple': tuple,
    'tuple_items': lambda x: [tuple(e) for e in x],
    'tuple_of_tuples': lambda x: tuple(tuple(e) for e in x),
    'tuple_lists': lambda x: tuple(tuple(e) if type(e) is list else e for e in x),
    'set_items': lambda x: [set(e) if type(e) is list and len(e) else {} for e in x],
    'float': float,
    'complex': complex,
    'dict_values_tuple': lambda x: {k: tuple(v) for k, v in x.items()},
    'deep_tuple': _dc_deep_tuple,
}
def _dc_restore(rule, args):
    if rule is None:
        return args
    fixed, rest = rule['args'], rule['rest']
    if type(args) is not list or len(args) < len(fixed):
        raise ValueError('%d arguments where the task takes %d' % (len(args), len(fixed)))
    out = []
    for i, a in enumerate(args):
        conv = fixed[i] if i < len(fixed) else rest
        if conv is None:
            break
        try:
            out.append(_DC_CONVERT[conv](a))
        except Exception as e:
            raise ValueError('argument %d cannot be made %s (%s: %s)' % (i, conv, type(e).__name__, e)) from None
    return out
def _dc_loosen(x):
    t = type(x)
    if isinstance(x, dict):
        return {_dc_loosen(k): _dc_loosen(v) for k, v in x.items()}
    if isinstance(x, tuple) or t is list:
        return (list if t is list else tuple)(_dc_loosen(v) for v in x)
    return x
def _dc_not_none(x):
    return x if type(x) is bool else x is not None
def _dc_surface_area(base_edge, height):
    slant = math.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 2 * (base_edge * slant))
def _dc_digit_distance(a, b):
    x, y = str(a), str(b)
    width = max(len(x), len(y))
    return sum(abs(int(p) - int(q)) for p, q in zip(x.zfill(width), y.zfill(width)))
def _dc_poly(xs, x):
    return sum(c * math.pow(x, i) for i, c in enumerate(xs))
)PY";

}  // namespace dc::eval
