// EvalPlus' per-task rules, written from its documented behaviour (evalplus/data/mbpp.py
// `mbpp_deserialize_inputs`, evalplus/eval/__init__.py and _special_oracle.py; none of its code is used):
// - how MBPP+ task N's inputs, stored as JSON, become the call's arguments again (tuples, sets, complex
//   numbers: JSON has only lists), and
// - the special oracles: the tasks whose answers EvalPlus compares otherwise than `==` / atol.
// The C++ side decides which rule and oracle a task has; kEvalPlusPython applies them inside the sandbox
// (both runners, truth_runner.h and check_runner.h, start with it).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "eval/humaneval.h"

namespace dc::eval {

// How a task's JSON inputs become its arguments: null when they are used as JSON gives them (every
// HumanEval+ task, most MBPP+ tasks); else {"args": [conversion of argument 0, 1, ...], "rest": conversion
// of every further argument, or null: they are dropped, as EvalPlus drops them}. An input with fewer
// arguments than "args" is malformed. The conversions (kEvalPlusPython's _DC_CONVERT):
//   same                x as it is
//   tuple               tuple(x)
//   tuple_items         [tuple(e) for e in x]
//   tuple_of_tuples     tuple(tuple(e) for e in x)
//   tuple_lists         tuple(tuple(e) if e is a list else e for e in x)
//   set_items           [set(e) if e is a non-empty list else {} for e in x]   ({} is a dict, as EvalPlus has it)
//   float, complex      float(x), complex(x) (complex("1+2j"): MBPP+ stores complex numbers as strings)
//   dict_values_tuple   {k: tuple(v) for k, v in x.items()}
//   deep_tuple          every list at any depth a tuple
nlohmann::json input_rule(const Task& task);

// The special oracle of a task ("" when none), by dataset and entry point as EvalPlus keys them:
//   find_zero        HumanEval/32: passes when |poly(xs, x)| <= the task's atol at the returned x
//   any_answer       MBPP are_equivalent (164): any answer returned in time passes
//   expected_or_zero MBPP sum_div (295): the expected output, or 0
//   surface_area     MBPP surface_Area (581): the expected output, or within atol of the pyramid's surface
//                    with "height" read as the perpendicular height, rounded
//   digit_distance   MBPP digit_distance_nums (558): the expected output, or the digit distance with the
//                    shorter number zero-padded
//   set_equal        MBPP similar_elements, find_char_long, common_in_nested_lists, extract_singly,
//                    larg_nnum, intersection_array, find_dissimilar, Diff: set(answer) == set(expected)
//   not_none         MBPP check_str, text_match_three, text_starta_endb (they return re.Match objects):
//                    the expected output is whether the canonical answer is not None, and an answer is
//                    compared as `answer is not None` (a bool answer as itself)
std::string special_oracle(const Task& task);

// The Python both runners start with: _DC_CONVERT and _dc_restore(rule, args) (a ValueError naming the
// argument when an input does not fit its rule), _dc_loosen (a dict / tuple subclass as the builtin it
// compares as: Counter, namedtuple), _dc_not_none, and the oracles' reference functions
// _dc_surface_area(base_edge, height), _dc_digit_distance(a, b), _dc_poly(xs, x).
extern const char* const kEvalPlusPython;

}  // namespace dc::eval
